/* The language-model data sets: "text" windows and their next-byte labels,
 * the held-out tail, determinism and the byte decoding; "tokens" on llm.c
 * token files the test writes (shards, the tail without val=, every
 * malformed file), and scripts/tokens_from_text.py against "text". */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/models/data/dataset.h"

#define MAGIC 20240520

static char dir[64];

static ax_dataset *open_ds(const char *name, int split, const char *fmt, ...) {
  char s[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s, sizeof s, fmt, ap);
  va_end(ap);
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  ax_dataset *ds = NULL;
  AX_ASSERT_OK(ax_dataset_open(name, &cfg, split, &ds));
  return ds;
}

/* The error of opening data set `name` with config s (split train). */
static int open_err(const char *name, const char *s) {
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  ax_dataset *ds = NULL;
  int rc = ax_dataset_open(name, &cfg, AX_SPLIT_TRAIN, &ds);
  assert_null(ds);
  return rc;
}

/* Example e of ds: its T inputs and T labels. */
static void example(const ax_dataset *ds, int64_t e, int32_t *x, int32_t *y,
                    int T) {
  ax_tlist in = {0}, lab = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds, &e, 1, &in, &lab));
  assert_int_equal(in.n, 1);
  assert_int_equal(lab.n, 1);
  assert_int_equal(in.t[0]->dtype, AX_I32);
  assert_int_equal(in.t[0]->ndim, 2);
  assert_int_equal(in.t[0]->shape[1], T);
  assert_int_equal(lab.t[0]->ndim, 1);
  assert_int_equal(lab.t[0]->shape[0], T);
  memcpy(x, ax_i32(in.t[0]), sizeof *x * (size_t)T);
  memcpy(y, ax_i32(lab.t[0]), sizeof *y * (size_t)T);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
}

/* Checks that example e of ds is the window of T + 1 tokens of seq from
 * position `at`: inputs seq[at..at+T), labels seq[at+1..at+T]. */
static void expect_window(const ax_dataset *ds, int64_t e, const int32_t *seq,
                          int64_t at, int T) {
  int32_t x[256], y[256];
  example(ds, e, x, y, T);
  for (int j = 0; j < T; j++) {
    assert_int_equal(x[j], seq[at + j]);
    assert_int_equal(y[j], seq[at + j + 1]);
  }
}

/* ---- text ---- */

/* 1000 bytes: a head of letters, a tail (the last 100) of digits. */
static void make_text(unsigned char *b, int32_t *ids) {
  for (int i = 0; i < 1000; i++) {
    b[i] = i < 900 ? (unsigned char)('a' + (i * 7) % 26)
                   : (unsigned char)('0' + (i * 3) % 10);
    ids[i] = b[i];
  }
}

static void test_text_windows(void **state) {
  (void)state;
  unsigned char b[1000];
  int32_t ids[1000];
  make_text(b, ids);
  const char *path = ax_test_write_file(dir, "t.txt", b, sizeof b, 0);
  char file[512];
  snprintf(file, sizeof file, "%s", path);
  for (int gz = 0; gz < 2; gz++) {
    if (gz)
      snprintf(file, sizeof file, "%s",
               ax_test_write_file(dir, "t.txt.gz", b, sizeof b, 1));
    ax_dataset *tr =
        open_ds("text", AX_SPLIT_TRAIN, "file=%s,seq=16,val=0.1", file);
    ax_dataset *te =
        open_ds("text", AX_SPLIT_TEST, "file=%s,seq=16,val=0.1", file);
    /* 900 train bytes: (900 - 1) / 16 windows; 100 test: 99 / 16. */
    assert_int_equal(ax_dataset_size(tr), 56);
    assert_int_equal(ax_dataset_size(te), 6);
    assert_int_equal(ax_dataset_vocab(tr), 256);
    assert_int_equal(ax_dataset_classes(tr), 0);
    assert_string_equal(ax_dataset_token_unit(tr), "byte");
    for (int64_t e = 0; e < 56; e++)
      expect_window(tr, e, ids, e * 16, 16);
    for (int64_t e = 0; e < 6; e++)
      expect_window(te, e, ids, 900 + e * 16, 16);
    /* The held-out tail is disjoint from train: no train input or label
     * is a digit, every test one is. */
    for (int split = 0; split < 2; split++) {
      const ax_dataset *ds = split ? te : tr;
      for (int64_t e = 0; e < ax_dataset_size(ds); e++) {
        int32_t x[16], y[16];
        example(ds, e, x, y, 16);
        for (int j = 0; j < 16; j++) {
          assert_int_equal(x[j] >= '0' && x[j] <= '9', split);
          assert_int_equal(y[j] >= '0' && y[j] <= '9', split);
        }
      }
    }
    ax_dataset_close(tr);
    ax_dataset_close(te);
  }
  /* max_bytes reads the head only: 200 bytes, 190 train. */
  ax_dataset *h = open_ds("text", AX_SPLIT_TRAIN,
                          "file=%s,seq=10,val=0.05,max_bytes=200", file);
  assert_int_equal(ax_dataset_size(h), (190 - 1) / 10);
  expect_window(h, 17, ids, 170, 10);
  ax_dataset_close(h);
}

static void test_text_determinism(void **state) {
  (void)state;
  unsigned char b[1000];
  int32_t ids[1000];
  make_text(b, ids);
  const char *path = ax_test_write_file(dir, "d.txt", b, sizeof b, 0);
  ax_dataset *a = open_ds("text", AX_SPLIT_TRAIN, "file=%s,seq=8", path);
  ax_dataset *c = open_ds("text", AX_SPLIT_TRAIN, "file=%s,seq=8", path);
  /* The same shuffled batches from two opens and one seed; an example is
   * the same whatever batch it is in. */
  ax_loader *la, *lc;
  AX_ASSERT_OK(ax_loader_new(a, 7, 1, 1, 42, &la));
  AX_ASSERT_OK(ax_loader_new(c, 7, 1, 1, 42, &lc));
  ax_loader_start(la, 3);
  ax_loader_start(lc, 3);
  ax_tlist ia = {0}, ya = {0}, ic = {0}, yc = {0};
  AX_ASSERT_OK(ax_loader_next(la, &ia, &ya));
  AX_ASSERT_OK(ax_loader_next(lc, &ic, &yc));
  assert_memory_equal(ax_i32(ia.t[0]), ax_i32(ic.t[0]), 7 * 8 * 4);
  assert_memory_equal(ax_i32(ya.t[0]), ax_i32(yc.t[0]), 7 * 8 * 4);
  for (int b2 = 0; b2 < 7; b2++) {
    /* Which window is row b2: its first byte's position is a multiple of
     * 8 whose bytes match. */
    int found = 0;
    for (int64_t e = 0; e < ax_dataset_size(a) && !found; e++) {
      int32_t x[8], y[8];
      example(a, e, x, y, 8);
      found = !memcmp(x, ax_i32(ia.t[0]) + b2 * 8, sizeof x) &&
              !memcmp(y, ax_i32(ya.t[0]) + b2 * 8, sizeof y);
    }
    assert_true(found);
  }
  ax_tlist_clear(&ia), ax_tlist_clear(&ya);
  ax_tlist_clear(&ic), ax_tlist_clear(&yc);
  ax_loader_free(la);
  ax_loader_free(lc);
  ax_dataset_close(a);
  ax_dataset_close(c);
}

static void test_text_decode(void **state) {
  (void)state;
  static const char s[] = "Caf\xc3\xa9 au lait,\nd\xc3\xa9j\xc3\xa0 vu.";
  const char *path = ax_test_write_file(dir, "u.txt", s, sizeof s - 1, 0);
  ax_dataset *ds = open_ds("text", AX_SPLIT_TRAIN, "file=%s,seq=4", path);
  int32_t ids[64];
  char out[64];
  int64_t n = ax_dataset_encode(ds, s, sizeof s - 1, ids, 64);
  assert_int_equal(n, sizeof s - 1);
  assert_int_equal(ids[3], 0xc3);
  assert_int_equal(ax_dataset_decode(ds, ids, n, out, sizeof out), n);
  assert_memory_equal(out, s, (size_t)n);
  assert_int_equal(ax_dataset_decode(ds, ids, n, out, 5), 5); /* cap */
  ids[0] = 256;
  assert_int_equal(ax_dataset_decode(ds, ids, 1, out, sizeof out), -1);
  assert_string_equal(ax_dataset_token(ds, 'C'), "C");
  assert_string_equal(ax_dataset_token(ds, '\n'), "\n");
  assert_null(ax_dataset_token(ds, 256));
  /* Windows of the first example: bytes 0..4 of the UTF-8 text. */
  int32_t x[4], y[4];
  example(ds, 0, x, y, 4);
  assert_int_equal(x[0], 'C');
  assert_int_equal(y[2], 0xc3);
  assert_int_equal(y[3], 0xa9);
  AX_ASSERT_CLOSE(ax_bits_per_token(log(2.0) * 1.5), 1.5, 1e-12, 0);
  ax_dataset_close(ds);
  /* clean=1: dictionary markup removed before the bytes are cut. */
  static const char dict[] =
      "Abdicator \\Ab\"di*ca`tor\\, n.\n   One who abdicates.\n"
      "   [1913 Webster]\n\n   A <b>bold</b> line, &amp; more.\n";
  path = ax_test_write_file(dir, "dict.txt", dict, sizeof dict - 1, 0);
  ds = open_ds("text", AX_SPLIT_TRAIN, "file=%s,seq=8,clean=1,val=0.1", path);
  assert_true(ax_dataset_size(ds) >= 3);
  for (int64_t e = 0; e < ax_dataset_size(ds); e++) {
    int32_t cx[8], cy[8];
    example(ds, e, cx, cy, 8);
    assert_int_equal(ax_dataset_decode(ds, cx, 8, out, sizeof out), 8);
    if (e == 0)
      assert_memory_equal(out, "One who ", 8);
    for (int j = 0; j < 8; j++)
      assert_null(memchr("<>\\[]", out[j], 5));
  }
  ax_dataset_close(ds);
}

/* ---- tokens ---- */

static void put_le32(unsigned char *p, int32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)((uint32_t)v >> (8 * i));
}

/* Writes an llm.c token file dir/name: a header (magic, version, count)
 * and the n tokens as little-endian uint16, with `extra` bytes more (or,
 * negative, fewer). Returns the path (static). */
static const char *write_tokens(const char *name, int32_t magic,
                                int32_t version, int32_t count,
                                const int32_t *tok, int n, int extra) {
  size_t size = 1024 + 2 * (size_t)n + (extra > 0 ? (size_t)extra : 0);
  unsigned char *b = calloc(1, size);
  assert_non_null(b);
  put_le32(b, magic), put_le32(b + 4, version), put_le32(b + 8, count);
  for (int i = 0; i < n; i++) {
    b[1024 + 2 * i] = (unsigned char)tok[i];
    b[1024 + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
  }
  const char *path = ax_test_write_file(
      dir, name, b, (size_t)((long)size - (extra < 0 ? -extra : 0)), 0);
  free(b);
  return path;
}

static void test_tokens_roundtrip(void **state) {
  (void)state;
  static int32_t t[1000], v[200];
  for (int i = 0; i < 1000; i++)
    t[i] = (i * 7919) % 50257;
  for (int i = 0; i < 200; i++)
    v[i] = 50256 - i;
  char train[512], val[512];
  snprintf(train, sizeof train, "%s",
           write_tokens("rt_train.bin", MAGIC, 1, 1000, t, 1000, 0));
  snprintf(val, sizeof val, "%s",
           write_tokens("rt_val.bin", MAGIC, 1, 200, v, 200, 0));
  ax_dataset *tr =
      open_ds("tokens", AX_SPLIT_TRAIN, "train=%s,val=%s,seq=16", train, val);
  ax_dataset *te =
      open_ds("tokens", AX_SPLIT_TEST, "train=%s,val=%s,seq=16", train, val);
  assert_int_equal(ax_dataset_size(tr), 999 / 16);
  assert_int_equal(ax_dataset_size(te), 199 / 16);
  assert_int_equal(ax_dataset_vocab(tr), 50257);
  assert_string_equal(ax_dataset_token_unit(tr), "token");
  for (int64_t e = 0; e < ax_dataset_size(tr); e++)
    expect_window(tr, e, t, e * 16, 16);
  for (int64_t e = 0; e < ax_dataset_size(te); e++)
    expect_window(te, e, v, e * 16, 16);
  /* Not byte-level: no text for its ids. */
  char out[8];
  assert_int_equal(ax_dataset_decode(tr, t, 4, out, sizeof out), -1);
  assert_null(ax_dataset_token(tr, 65));
  ax_dataset_close(tr);
  ax_dataset_close(te);
  /* Without val= the last 5% of the train tokens are the test split:
   * 950 train, 50 test. */
  tr = open_ds("tokens", AX_SPLIT_TRAIN, "train=%s,seq=8", train);
  te = open_ds("tokens", AX_SPLIT_TEST, "train=%s,seq=8", train);
  assert_int_equal(ax_dataset_size(tr), 949 / 8);
  assert_int_equal(ax_dataset_size(te), 49 / 8);
  expect_window(tr, 949 / 8 - 1, t, (949 / 8 - 1) * 8, 8);
  for (int64_t e = 0; e < ax_dataset_size(te); e++)
    expect_window(te, e, t, 950 + e * 8, 8);
  ax_dataset_close(tr);
  ax_dataset_close(te);
  /* Byte tokens (vocab=256) are byte-level. */
  static int32_t bt[64];
  for (int i = 0; i < 64; i++)
    bt[i] =
        "the quick brown fox jumps over the lazy dog, then sleeps. "[i % 58];
  tr = open_ds("tokens", AX_SPLIT_TRAIN, "train=%s,seq=4,vocab=256",
               write_tokens("b.bin", MAGIC, 1, 64, bt, 64, 0));
  assert_string_equal(ax_dataset_token_unit(tr), "byte");
  assert_int_equal(ax_dataset_decode(tr, bt, 9, out, sizeof out), 8);
  assert_memory_equal(out, "the quic", 8);
  ax_dataset_close(tr);
}

static void test_tokens_shards(void **state) {
  (void)state;
  static int32_t a[100], b[50];
  for (int i = 0; i < 100; i++)
    a[i] = i;
  for (int i = 0; i < 50; i++)
    b[i] = 1000 + i;
  write_tokens("s_train_001.bin", MAGIC, 1, 50, b, 50, 0);
  write_tokens("s_train_000.bin", MAGIC, 1, 100, a, 100, 0);
  write_tokens("s_val_000.bin", MAGIC, 1, 50, b, 50, 0);
  /* Sorted glob order; windows stay inside a shard: 99 / 10 + 49 / 10. */
  ax_dataset *tr =
      open_ds("tokens", AX_SPLIT_TRAIN,
              "train=%s/s_train_*.bin,val=%s/s_val_*.bin,seq=10", dir, dir);
  assert_int_equal(ax_dataset_size(tr), 9 + 4);
  expect_window(tr, 8, a, 80, 10);
  for (int64_t e = 0; e < 4; e++)
    expect_window(tr, 9 + e, b, e * 10, 10);
  ax_dataset_close(tr);
  /* Without val=, the tail of 150 tokens (7) has no window of 11. */
  char s[512];
  snprintf(s, sizeof s, "train=%s/s_train_*.bin,seq=10", dir);
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  ax_dataset *ds = NULL;
  AX_ASSERT_ERR(ax_dataset_open("tokens", &cfg, AX_SPLIT_TEST, &ds),
                AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), "too few"));
  /* Its train split: shard 0 whole, 43 tokens of shard 1. */
  tr = open_ds("tokens", AX_SPLIT_TRAIN, "%s", s);
  assert_int_equal(ax_dataset_size(tr), 9 + 42 / 10);
  ax_dataset_close(tr);
}

/* Opens `name` with config "KEY=path" expecting `code` with a message that
 * names path and holds `what`. */
static void expect_bad(const char *name, const char *key, const char *path,
                       int code, const char *what) {
  char s[600], p[512];
  snprintf(p, sizeof p, "%s", path);
  snprintf(s, sizeof s, "%s=%s", key, p);
  AX_ASSERT_ERR(open_err(name, s), code);
  if (!strstr(ax_errmsg(), p) || !strstr(ax_errmsg(), what))
    fail_msg("message '%s' does not name %s and '%s'", ax_errmsg(), p, what);
}

static void test_tokens_malformed(void **state) {
  (void)state;
  static int32_t t[64];
  for (int i = 0; i < 64; i++)
    t[i] = i;
  expect_bad("tokens", "train",
             write_tokens("m1.bin", 20240521, 1, 64, t, 64, 0), AX_EFORMAT,
             "bad magic");
  expect_bad("tokens", "train", write_tokens("m2.bin", MAGIC, 2, 64, t, 64, 0),
             AX_EFORMAT, "bad version");
  expect_bad("tokens", "train", write_tokens("m3.bin", MAGIC, 1, 64, t, 64, -3),
             AX_EFORMAT, "truncated");
  expect_bad("tokens", "train", write_tokens("m4.bin", MAGIC, 1, 60, t, 64, 0),
             AX_EFORMAT, "do not match");
  expect_bad("tokens", "train", write_tokens("m5.bin", MAGIC, 1, 0, t, 0, 0),
             AX_EFORMAT, "0 tokens");
  t[17] = 50257;
  expect_bad("tokens", "train", write_tokens("m6.bin", MAGIC, 1, 64, t, 64, 0),
             AX_EFORMAT, "token 50257 at position 17 is out of range");
  t[17] = 300; /* in range of the default vocab, not of vocab=256 */
  const char *p = write_tokens("m7.bin", MAGIC, 1, 64, t, 64, 0);
  char s[512];
  snprintf(s, sizeof s, "train=%s,vocab=256", p);
  AX_ASSERT_ERR(open_err("tokens", s), AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), "token 300"));
  expect_bad("tokens", "train", ax_test_write_file(dir, "m8.bin", "", 0, 0),
             AX_EFORMAT, "empty file");
  expect_bad("tokens", "train", ax_test_write_file(dir, "m9.bin", t, 100, 0),
             AX_EFORMAT, "shorter than the 1024-byte header");
  /* Missing files; a bad val= fails the test split only. */
  char missing[128];
  snprintf(missing, sizeof missing, "%s/none.bin", dir);
  expect_bad("tokens", "train", missing, AX_ENOTFOUND, "no such file");
  expect_bad("text", "file", missing, AX_ENOTFOUND, "none.bin");
  t[17] = 17;
  p = write_tokens("ok.bin", MAGIC, 1, 64, t, 64, 0);
  snprintf(s, sizeof s, "train=%s,val=%s,seq=8", p, missing);
  ax_dataset *tr = open_ds("tokens", AX_SPLIT_TRAIN, "%s", s);
  ax_dataset_close(tr);
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  ax_dataset *ds = NULL;
  AX_ASSERT_ERR(ax_dataset_open("tokens", &cfg, AX_SPLIT_TEST, &ds),
                AX_ENOTFOUND);
  /* Text: empty, too short for a window, bad settings. */
  expect_bad("text", "file", ax_test_write_file(dir, "e.txt", "", 0, 0),
             AX_EFORMAT, "empty file");
  p = ax_test_write_file(dir, "short.txt", "0123456789", 10, 0);
  snprintf(s, sizeof s, "file=%s,seq=16", p);
  AX_ASSERT_ERR(open_err("text", s), AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), p));
  assert_non_null(strstr(ax_errmsg(), "too few"));
  AX_ASSERT_ERR(open_err("text", "seq=0"), AX_EINVAL);
  AX_ASSERT_ERR(open_err("text", "val=1"), AX_EINVAL);
  AX_ASSERT_ERR(open_err("tokens", "seq=8"), AX_EINVAL); /* no train= */
  snprintf(s, sizeof s, "train=%s,vocab=70000", p);
  AX_ASSERT_ERR(open_err("tokens", s), AX_EINVAL);
}

/* scripts/tokens_from_text.py writes the text's bytes as tokens: "tokens"
 * with vocab=256 on its files gives the examples "text" gives. */
static void test_tokens_script(void **state) {
  (void)state;
  const char *src = getenv("AXON_SOURCE_DIR");
  if (!src || system("python3 -c 'import gzip' >/dev/null 2>&1") != 0)
    skip();
  static unsigned char b[3000];
  for (int i = 0; i < 3000; i++)
    b[i] = (unsigned char)((i * 2654435761u) >> 24);
  char txt[512], cmd[2048];
  snprintf(txt, sizeof txt, "%s",
           ax_test_write_file(dir, "script.txt.gz", b, sizeof b, 1));
  snprintf(cmd, sizeof cmd,
           "python3 %s/scripts/tokens_from_text.py %s %s/sc_train.bin "
           "--val 0.1 --val-out %s/sc_val.bin >/dev/null",
           src, txt, dir, dir);
  assert_int_equal(system(cmd), 0);
  for (int split = 0; split < 2; split++) {
    ax_dataset *a = open_ds("text", split, "file=%s,seq=32,val=0.1", txt);
    ax_dataset *c = open_ds("tokens", split,
                            "train=%s/sc_train.bin,val=%s/sc_val.bin,seq=32,"
                            "vocab=256",
                            dir, dir);
    assert_int_equal(ax_dataset_size(a), ax_dataset_size(c));
    for (int64_t e = 0; e < ax_dataset_size(a); e++) {
      int32_t xa[32], ya[32], xc[32], yc[32];
      example(a, e, xa, ya, 32);
      example(c, e, xc, yc, 32);
      assert_memory_equal(xa, xc, sizeof xa);
      assert_memory_equal(ya, yc, sizeof ya);
    }
    ax_dataset_close(a);
    ax_dataset_close(c);
  }
}

/* The installed dict-gcide dictionary is the default file. */
static void test_text_default_file(void **state) {
  (void)state;
  struct stat st;
  if (stat("/usr/share/dictd/gcide.dict.dz", &st) != 0)
    skip();
  ax_dataset *ds = open_ds("text", AX_SPLIT_TRAIN, "max_bytes=64k");
  assert_int_equal(ax_dataset_size(ds), (65536 - 3276 - 1) / 64);
  int32_t x[64], y[64];
  char out[65];
  example(ds, 0, x, y, 64);
  assert_int_equal(ax_dataset_decode(ds, x, 64, out, 64), 64);
  out[64] = 0;
  assert_non_null(strstr(out, "gcide")); /* the dictd header */
  ax_dataset_close(ds);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_text_windows),
      cmocka_unit_test(test_text_determinism),
      cmocka_unit_test(test_text_decode),
      cmocka_unit_test(test_tokens_roundtrip),
      cmocka_unit_test(test_tokens_shards),
      cmocka_unit_test(test_tokens_malformed),
      cmocka_unit_test(test_tokens_script),
      cmocka_unit_test(test_text_default_file),
  };
  snprintf(dir, sizeof dir, "/tmp/axon-lmdata-XXXXXX");
  if (!mkdtemp(dir))
    return 1;
  int failed = AX_TEST_MAIN(t);
  ax_test_rmtree(dir);
  return failed;
}
