/* Data sets, deterministic given a seed, streamed in batches on the CPU.
 *
 * Names and what one example becomes:
 *  - "fashion-mnist" (IDX files, gzip): inputs {f32 (B, 1, S, S)} normalised
 *    with the data set's mean and std, S = 28, or 32 with pad=1 (the
 *    border is the background, a 0 pixel, for ResNet20); labels {i32 (B)}
 *    in [0, 10). Files {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
 *    Config: dir=/usr/share/datasets/fashion-mnist, pad=0|1, limit=N.
 *  - "cifar10" (binary version: 1 label byte + 3072 pixel bytes per record):
 *    inputs {f32 (B, 3, 32, 32)} normalised per channel, labels {i32 (B)}.
 *    Files data_batch_1..5.bin (train) or test_batch.bin (test), each
 *    plain or gzip (name.bin.gz). Config: dir=data/cifar-10-batches-bin,
 *    limit=N.
 *  - "gcide" (dict-gcide's .dz, gzip): BERT MLM + NSP examples. inputs
 *    {i32 token ids (B, T), i32 segment ids (B, T), f32 attention mask
 *    (B, T) with 1 = token, 0 = padding}; labels {i32 MLM labels (B * T),
 *    -100 where not masked; i32 NSP labels (B), 1 = random next sentence}.
 *    Config: file=/usr/share/dictd/gcide.dict.dz, seq=128, vocab=8192,
 *    examples=N (default 20000 train, 2000 test), seed=S, max_bytes=16m
 *    (decompressed corpus bytes read; 0 = all). Sentences are lower-cased
 *    word and punctuation tokens; the vocabulary is the specials below then
 *    the most frequent train tokens. The test split uses the last tenth of
 *    the sentences, the train split the rest. Example e is [CLS] A [SEP] B
 *    [SEP] drawn from the stream (seed, e) alone; 15% of ordinary tokens are
 *    MLM targets (80% [MASK], 10% random, 10% kept).
 *  - "text": byte-level language-model examples (vocab 256) from any file,
 *    gzip or plain, read as bytes (UTF-8 text stays its bytes). inputs
 *    {i32 token ids (B, T)}; labels {i32 next-token ids (B * T)}: the
 *    window's bytes 1..T, so example e is the T + 1 bytes from e * T of its
 *    split, inputs its first T, labels its last T (windows at stride T,
 *    disjoint but in their last byte; the loader shuffles them). The train
 *    split is the head of the bytes read, the test split the held-out tail
 *    (the last val of them). Config: file=/usr/share/dictd/gcide.dict.dz
 *    (dict-gcide's dictionary, markup and all), seq=64 (T), max_bytes=16m
 *    (as gcide's), val=0.05, clean=0|1 (1: dictionary markup removed first,
 *    axi_text_clean). Token unit "byte": ax_dataset_decode gives the text.
 *  - "tokens": the same windows of pre-tokenized files in llm.c's format:
 *    a header of 256 little-endian int32 (magic 20240520, version 1 =
 *    uint16 GPT-2 tokens, the token count), then the count's uint16
 *    tokens. Config: train=PATH (a file or a glob of shards in sorted
 *    order, e.g. "data/fineweb_train_*.bin"), val=PATH (the
 *    test split; without it the last 5% of the train tokens, which the
 *    train split then leaves out), seq=64, vocab=50257. Every header field,
 *    the file size against the count and every token (< vocab) are checked
 *    at open: AX_EFORMAT naming the file (bad magic, bad version,
 *    truncated, size not matching the count, token out of range, empty).
 *    Windows do not cross from one file into the next. Token unit "token",
 *    or "byte" with vocab=256 (scripts/tokens_from_text.py's files).
 *  - "synthetic": random inputs of a given shape and random labels, for
 *    benchmarks and tests. Config: shape=C/H/W or D (default 1/28/28),
 *    classes=K (10), examples=N (1024), seed=S. Inputs {f32 (B, C, H, W) or
 *    (B, D)} standard normal, labels {i32 (B)}; example i depends only on
 *    (seed, split, i).
 *
 * split: 0 = train, 1 = test. Thread safety: an ax_dataset may be read from
 * several threads; an ax_loader is used by one thread. */
#ifndef AX_DATASET_H
#define AX_DATASET_H

#include "axon/models/config.h"
#include "axon/models/module.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { AX_SPLIT_TRAIN = 0, AX_SPLIT_TEST = 1 };

typedef struct ax_dataset ax_dataset;

/* Opens a data set. AX_ENOTFOUND (unknown name or missing file), AX_EIO,
 * AX_EFORMAT (truncated or malformed file), with a message naming the file. */
int ax_dataset_open(const char *name, const ax_config *cfg, int split,
                    ax_dataset **out);
void ax_dataset_close(ax_dataset *ds); /* NULL-safe */
int64_t ax_dataset_size(const ax_dataset *ds);
int ax_dataset_classes(const ax_dataset *ds); /* 0 when not a classifier */
/* Vocabulary size for text data sets (token ids lie in [0, vocab)), 0
 * otherwise: gcide's at most the configured vocab=, less when the corpus
 * has fewer distinct tokens; 256 for "text", vocab= for "tokens". */
int ax_dataset_vocab(const ax_dataset *ds);

/* Special token ids of the text data sets, and the MLM label of positions
 * that are not predicted. */
enum {
  AX_TOK_PAD = 0,
  AX_TOK_UNK = 1,
  AX_TOK_CLS = 2,
  AX_TOK_SEP = 3,
  AX_TOK_MASK = 4,
  AX_TOK_SPECIALS = 5 /* ids below this are special */
};
#define AX_MLM_IGNORE (-100)

/* The text of token `id` ("[PAD]", "the", ...) of the gcide data set, or
 * the one-byte string of byte `id` of a byte-level set ("" for byte 0: use
 * ax_dataset_decode for text); NULL for other data sets or an id out of
 * range. The string lives as long as ds. */
const char *ax_dataset_token(const ax_dataset *ds, int id);
/* The id of a lower-case token (AX_TOK_UNK when not in the vocabulary) of
 * the gcide data set, or -1 for other data sets. */
int ax_dataset_token_id(const ax_dataset *ds, const char *tok);

/* What a token of a language-model data set ("text", "tokens") stands
 * for: "byte" when its ids are bytes, else "token"; NULL for other data
 * sets (whose loss is no next-token loss). The string is static. */
const char *ax_dataset_token_unit(const ax_dataset *ds);
/* A mean cross-entropy in nats per token as bits per token: nats / ln 2
 * (bits per byte for a byte-level set). */
double ax_bits_per_token(double nats);
/* Byte-level data sets (token unit "byte"): writes the bytes of ids[0..n)
 * into out (at most cap; no NUL is added) and returns how many it wrote;
 * -1 when ds is not byte-level or an id is not in [0, 256). */
int64_t ax_dataset_decode(const ax_dataset *ds, const int32_t *ids, int64_t n,
                          char *out, size_t cap);
/* The inverse: the ids of the bytes s[0..len) into ids (at most cap);
 * their count, or -1 when ds is not byte-level. */
int64_t ax_dataset_encode(const ax_dataset *ds, const char *s, size_t len,
                          int32_t *ids, int64_t cap);

/* Gathers examples idx[0..n) into new CPU tensors (the caller releases
 * inputs and labels with ax_tlist_clear). */
int ax_dataset_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                     ax_tlist *inputs, ax_tlist *labels);

/* Iterates over shuffled (seed, epoch) batches of exactly `batch` examples;
 * the last partial batch is dropped when drop_last, else returned short. */
typedef struct ax_loader ax_loader;
int ax_loader_new(const ax_dataset *ds, int64_t batch, int shuffle,
                  int drop_last, uint64_t seed, ax_loader **out);
void ax_loader_free(ax_loader *ld);
/* Starts epoch `epoch` (reshuffles deterministically from seed and epoch). */
void ax_loader_start(ax_loader *ld, int epoch);
/* The next batch; returns AX_OK with data, or AX_ECLOSED at the epoch end. */
int ax_loader_next(ax_loader *ld, ax_tlist *inputs, ax_tlist *labels);
int64_t ax_loader_batches(const ax_loader *ld); /* batches per epoch */

#ifdef __cplusplus
}
#endif
#endif
