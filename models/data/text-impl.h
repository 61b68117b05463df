/* Internals of the text data sets: corpus cleaning, the word-level
 * tokenizer and the vocabulary. Not part of the public API (tests include it
 * to check the tokenizer).
 *
 * Pipeline: raw bytes (a dictd .dz or any text, gzip or plain)
 *   -> axi_text_clean: one line per paragraph, markup removed
 *   -> axi_corpus_build: lower-cased word and punctuation tokens, split into
 *      sentences, a vocabulary of the most frequent tokens, sentences stored
 *      as token ids. */
#ifndef AX_DATA_TEXT_H
#define AX_DATA_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/data/dataset.h"

/* Removes dictionary markup from src (len bytes) and writes running text
 * into a new malloc'd, NUL-terminated buffer: one line per paragraph
 * (paragraphs are separated by blank lines in src; the lines of a paragraph
 * are joined with spaces). Removed: SGML/XML tags (<p>, <def>, ...) and
 * entities (&amp; ...), dictd-GCIDE headword lines (\hw\ ...), bracketed
 * notes and etymologies ([1913 Webster], [L. ...]), braces of
 * cross-references ({Credit} -> Credit), accent codes (['e] -> e), sense
 * numbers ("1.", "(a)"), citations ("--Shak."), and the database header
 * and synonym-list paragraphs. Returns NULL when out of memory. */
char *axi_text_clean(const char *src, size_t len, size_t *out_len);

/* Tokenized sentences and their vocabulary. */
typedef struct axi_corpus {
  int32_t *ids;   /* the tokens of all sentences, back to back */
  int64_t *start; /* sentence i is ids[start[i] .. start[i + 1]) */
  int64_t n_sent;
  int64_t n_train; /* sentences [0, n_train) train, [n_train, n_sent) test */
  int vocab;       /* ids in use: specials + kept tokens */
  char **tokens;   /* vocab strings, tokens[id] */
  char *arena;     /* storage of the token strings */
  int32_t *table;  /* open-addressing hash of ids, for lookups */
  uint32_t mask;   /* table size - 1 */
} axi_corpus;

/* Tokenizes the cleaned text (axi_text_clean's output) into sentences and
 * builds a vocabulary of at most max_vocab ids: the 5 specials, then the
 * tokens of the train sentences by decreasing count, ties broken by byte
 * order of the strings. The last test_frac of the sentences form the test
 * part. AX_EFORMAT when fewer than 4 sentences are found. */
int axi_corpus_build(const char *text, size_t len, int max_vocab,
                     double test_frac, axi_corpus *out);
void axi_corpus_free(axi_corpus *c);
/* The id of a token string (lower-case), or AX_TOK_UNK. */
int axi_corpus_lookup(const axi_corpus *c, const char *tok, size_t len);

/* The corpus of an open "gcide" data set (borrowed), NULL for other kinds. */
const axi_corpus *axi_text_corpus(const ax_dataset *ds);

/* Calls fn(tok, len, end_of_sentence, arg) for each token of one cleaned
 * line (len bytes, no newline); end_of_sentence is 1 on the last token of a
 * sentence. Tokens are lower-cased into a scratch buffer. Sentence ends are
 * ., ? and ! followed by an upper-case word, a quote or parenthesis, or the
 * end of the line; a period after a single letter or a common abbreviation
 * (Mr., e.g., cf., ...) ends nothing. */
void axi_tokenize_line(const char *s, size_t len,
                       void (*fn)(const char *tok, size_t n, int eos,
                                  void *arg),
                       void *arg);

#endif
