/* The text data set: markup cleaning, tokenizer and vocabulary on texts the
 * test writes, BERT MLM/NSP example statistics and layout, determinism, and
 * the installed dict-gcide corpus. */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/models/data/dataset.h"
#include "axon/models/data/text-impl.h"

#define GCIDE "/usr/share/dictd/gcide.dict.dz"

static char tmpdir[64];

static int setup(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/axon-text-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ax_test_rmtree(tmpdir);
  return 0;
}

/* Writes s gzip-compressed to tmpdir/name; returns the path (static). */
static const char *write_gz(const char *name, const char *s) {
  return ax_test_write_file(tmpdir, name, s, strlen(s), 1);
}

static ax_dataset *open_text(const char *file, const char *extra, int split) {
  char s[512];
  snprintf(s, sizeof s, "file=%s,%s", file, extra);
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  ax_dataset *ds = NULL;
  AX_ASSERT_OK(ax_dataset_open("gcide", &cfg, split, &ds));
  return ds;
}

/* ---- cleaning ---- */

static void test_clean(void **state) {
  (void)state;
  static const char src[] =
      "00-database-short\n   The Dictionary\n\n"
      "Accredit \\Ac*cred\"it\\, v. t. [imp. & p. p. {Accredited}; p. pr.\n"
      "   & vb. n. {Accrediting}.] [F. accr['e]diter; [`a] (L. ad) +\n"
      "   cr['e]dit credit. See {Credit}.]\n"
      "   1. To put into credit; to sanction.\n"
      "      [1913 Webster]\n\n"
      "            His censure will accredit his praises.\n"
      "                                                  --Cowper.\n\n"
      "   Syn: credit, believe\n\n"
      "   2. A caf['e] near the <b>old</b> mill &amp; a [R.] pond.\n";
  size_t n;
  char *out = axi_text_clean(src, sizeof src - 1, &n);
  assert_non_null(out);
  assert_string_equal(out, "To put into credit; to sanction.\n"
                           "His censure will accredit his praises.\n"
                           "A cafe near the  old  mill & a  pond.\n");
  assert_int_equal(n, strlen(out));
  free(out);
}

/* ---- tokenizer and vocabulary ---- */

static const char small_text[] =
    "The cat sat on the mat. The dog ran to the cat! Did the cat see\n"
    "the dog? The bird sang a song. Mr. Smith heard the bird.\n"
    "\n"
    "The end of the story is near. A new day begins.\n";

/* The tokens of sentence i, joined with spaces. */
static void sentence_str(const ax_dataset *ds, int64_t i, char *buf,
                         size_t len) {
  const axi_corpus *c = axi_text_corpus(ds);
  buf[0] = '\0';
  for (int64_t k = c->start[i]; k < c->start[i + 1]; k++) {
    const char *t = ax_dataset_token(ds, c->ids[k]);
    snprintf(buf + strlen(buf), len - strlen(buf), "%s%s",
             k > c->start[i] ? " " : "", t);
  }
}

static void test_tokenizer(void **state) {
  (void)state;
  const char *path = write_gz("small.txt.gz", small_text);
  ax_dataset *ds = open_text(path, "vocab=1000,seq=16,examples=10", 0);
  const axi_corpus *c = axi_text_corpus(ds);
  assert_non_null(c);
  assert_int_equal(c->n_sent, 7);
  assert_int_equal(c->n_train, 5); /* at least two sentences are test */
  static const char *const want[7] = {
      "the cat sat on the mat .",    "the dog ran to the cat !",
      "did the cat see the dog ?",   "the bird sang a song .",
      "mr . smith heard the bird .", "the end of the story is near .",
      "a new day begins ."};
  char buf[256];
  /* Test-only words are unknown: the vocabulary comes from train text. */
  for (int i = 0; i < 5; i++) {
    sentence_str(ds, i, buf, sizeof buf);
    assert_string_equal(buf, want[i]);
  }
  sentence_str(ds, 6, buf, sizeof buf);
  assert_string_equal(buf, "a [UNK] [UNK] [UNK] .");
  /* Specials, then tokens by count, ties in byte order. */
  static const char *const order[] = {
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", ".",
      "cat",   "bird",  "dog",   "!",     "?",      "a",   "did"};
  for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++) {
    assert_string_equal(ax_dataset_token(ds, i), order[i]);
    assert_int_equal(ax_dataset_token_id(ds, order[i]), i);
  }
  assert_int_equal(ax_dataset_vocab(ds), 5 + 20);
  assert_null(ax_dataset_token(ds, 25));
  assert_int_equal(ax_dataset_token_id(ds, "story"), AX_TOK_UNK);
  ax_dataset_close(ds);
  /* A smaller vocabulary keeps the most frequent tokens. */
  ds = open_text(path, "vocab=12,seq=16", 0);
  assert_int_equal(ax_dataset_vocab(ds), 12);
  assert_string_equal(ax_dataset_token(ds, 11), "?");
  assert_int_equal(ax_dataset_token_id(ds, "a"), AX_TOK_UNK);
  sentence_str(ds, 3, buf, sizeof buf);
  assert_string_equal(buf, "the bird [UNK] [UNK] [UNK] .");
  ax_dataset_close(ds);
  /* Errors: a missing file, a text without enough sentences. */
  ax_config cfg;
  ax_dataset *bad = NULL;
  AX_ASSERT_OK(ax_config_parse(&cfg, "file=/nonexistent/x.dz"));
  AX_ASSERT_ERR(ax_dataset_open("gcide", &cfg, 0, &bad), AX_ENOTFOUND);
  assert_non_null(strstr(ax_errmsg(), "/nonexistent/x.dz"));
  char s[300];
  snprintf(s, sizeof s, "file=%s", write_gz("tiny.gz", "One two three."));
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  AX_ASSERT_ERR(ax_dataset_open("gcide", &cfg, 0, &bad), AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), "tiny.gz"));
  assert_null(bad);
}

/* ---- examples ---- */

/* A generated text of n sentences over a 60-word vocabulary. */
static char *generated_text(int n) {
  static const char *const words[] = {
      "alpha",  "bravo",   "charlie", "delta",  "echo",   "foxtrot", "golf",
      "hotel",  "india",   "juliet",  "kilo",   "lima",   "mike",    "november",
      "oscar",  "papa",    "quebec",  "romeo",  "sierra", "tango",   "uniform",
      "victor", "whiskey", "xray",    "yankee", "zulu",   "red",     "green",
      "blue",   "cyan",    "magenta", "yellow", "black",  "white",   "orange",
      "purple", "pink",    "brown",   "grey",   "gold",   "silver",  "bronze",
      "iron",   "tin",     "lead",    "zinc",   "copper", "nickel",  "cobalt",
      "argon",  "neon",    "xenon",   "radon",  "helium", "carbon",  "oxygen",
      "sulfur", "sodium",  "calcium", "boron"};
  char *s = malloc((size_t)n * 300 + 1), *p = s;
  ax_rng r;
  ax_rng_seed(&r, 77);
  for (int i = 0; i < n; i++) {
    int len = 4 + (int)ax_rng_below(&r, 20);
    for (int w = 0; w < len; w++) {
      const char *word = words[ax_rng_below(&r, 60)];
      if (w == 0)
        p += sprintf(p, "%c%s", word[0] - 'a' + 'A', word + 1);
      else
        p += sprintf(p, " %s", word);
    }
    p += sprintf(p, i % 5 == 4 ? ".\n\n" : ". ");
  }
  return s;
}

static void test_examples(void **state) {
  (void)state;
  char *text = generated_text(3000);
  const char *path = write_gz("gen.txt.gz", text);
  free(text);
  enum { B = 3000, T = 24 };
  ax_dataset *ds = open_text(path, "vocab=50,seq=24,examples=3000,seed=9", 0);
  assert_int_equal(ax_dataset_vocab(ds), 50);
  assert_int_equal(ax_dataset_size(ds), B);
  const axi_corpus *c = axi_text_corpus(ds);
  int64_t *idx = malloc(sizeof *idx * B);
  for (int i = 0; i < B; i++)
    idx[i] = i;
  ax_tlist in = {0}, lb = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds, idx, B, &in, &lb));
  assert_int_equal(in.n, 3);
  assert_int_equal(lb.n, 2);
  int64_t bt[2] = {B, T}, flat[1] = {B * T};
  AX_ASSERT_OK(ax_tensor_check(in.t[0], "ids", AX_I32, 2, bt));
  AX_ASSERT_OK(ax_tensor_check(in.t[1], "seg", AX_I32, 2, bt));
  AX_ASSERT_OK(ax_tensor_check(in.t[2], "mask", AX_F32, 2, bt));
  AX_ASSERT_OK(ax_tensor_check(lb.t[0], "mlm", AX_I32, 1, flat));
  AX_ASSERT_OK(ax_tensor_check(lb.t[1], "nsp", AX_I32, 1, bt));
  const int32_t *ids = ax_i32(in.t[0]), *seg = ax_i32(in.t[1]);
  const float *att = ax_f32(in.t[2]);
  const int32_t *mlm = ax_i32(lb.t[0]), *nsp = ax_i32(lb.t[1]);
  long ordinary = 0, selected = 0, masked = 0, kept = 0, random = 0, rnd = 0;
  for (int b = 0; b < B; b++) {
    const int32_t *x = ids + b * T, *y = mlm + b * T, *s = seg + b * T;
    const float *m = att + b * T;
    assert_int_equal(x[0], AX_TOK_CLS);
    int sep[2], ns = 0, len = 0;
    for (int t = 0; t < T; t++) {
      int orig = y[t] != AX_MLM_IGNORE ? y[t] : x[t];
      if (orig == AX_TOK_SEP) {
        assert_true(ns < 2);
        sep[ns++] = t;
      }
      if (orig == AX_TOK_PAD) {
        assert_true(m[t] == 0.0f && s[t] == 0);
      } else {
        assert_true(m[t] == 1.0f && t == len++); /* no gaps in the mask */
        assert_int_equal(s[t], ns == 2 ? t > sep[0] : ns == 1 && t > sep[0]);
      }
      if (orig < AX_TOK_SPECIALS) { /* never masked, never a target */
        assert_int_equal(y[t], AX_MLM_IGNORE);
        assert_int_equal(x[t], orig);
        continue;
      }
      assert_true(orig < 50);
      ordinary++;
      if (y[t] == AX_MLM_IGNORE)
        continue;
      selected++;
      if (x[t] == AX_TOK_MASK)
        masked++;
      else if (x[t] == y[t])
        kept++;
      else
        random++, assert_true(x[t] >= AX_TOK_SPECIALS && x[t] < 50);
    }
    assert_int_equal(ns, 2);
    assert_true(sep[0] >= 2 && sep[1] > sep[0] + 1);
    assert_true(nsp[b] == 0 || nsp[b] == 1);
    rnd += nsp[b];
    /* Is B the sentence after A? Compare the untruncated prefixes. */
    int64_t a = -1;
    for (int64_t i = 0; i < c->n_train && a < 0; i++) {
      int64_t la = c->start[i + 1] - c->start[i], k = 0;
      while (k < sep[0] - 1 && k < la &&
             c->ids[c->start[i] + k] ==
                 (y[1 + k] != AX_MLM_IGNORE ? y[1 + k] : x[1 + k]))
        k++;
      if (k == sep[0] - 1 && (k == la || sep[1] == T - 1))
        a = i;
    }
    assert_true(a >= 0);
    if (nsp[b] == 0) {
      int64_t nb = a + 1, k = 0;
      for (; sep[0] + 1 + k < sep[1]; k++) {
        int t = sep[0] + 1 + (int)k;
        int orig = y[t] != AX_MLM_IGNORE ? y[t] : x[t];
        if (c->ids[c->start[nb] + k] != orig)
          break;
      }
      assert_int_equal(sep[0] + 1 + k, sep[1]);
    }
  }
  print_message("mlm: %.4f selected; %.3f mask, %.3f random, %.3f kept; "
                "nsp %.3f random\n",
                (double)selected / ordinary, (double)masked / selected,
                (double)random / selected, (double)kept / selected,
                (double)rnd / B);
  AX_ASSERT_CLOSE((double)selected / ordinary, 0.15, 0.006, 0);
  AX_ASSERT_CLOSE((double)masked / selected, 0.80, 0.015, 0);
  AX_ASSERT_CLOSE((double)random / selected, 0.10 * 44 / 45, 0.012, 0);
  AX_ASSERT_CLOSE((double)kept / selected, 0.10 + 0.10 / 45, 0.012, 0);
  AX_ASSERT_CLOSE((double)rnd / B, 0.5, 0.03, 0);
  /* Determinism: any subset, any order, a second open, same values. */
  ax_dataset *ds2 = open_text(path, "vocab=50,seq=24,examples=3000,seed=9", 0);
  int64_t sub[3] = {2999, 17, 1000};
  ax_tlist in2 = {0}, lb2 = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds2, sub, 3, &in2, &lb2));
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 3; i++)
      assert_memory_equal((char *)in2.t[i]->data + k * T * 4,
                          (char *)in.t[i]->data + sub[k] * T * 4, T * 4);
    assert_memory_equal(ax_i32(lb2.t[0]) + k * T, mlm + sub[k] * T, T * 4);
    assert_int_equal(ax_i32(lb2.t[1])[k], nsp[sub[k]]);
  }
  ax_tlist_clear(&in2);
  ax_tlist_clear(&lb2);
  ax_dataset_close(ds2);
  /* Another seed gives other examples; the test split, other sentences. */
  ds2 = open_text(path, "vocab=50,seq=24,examples=3000,seed=10", 0);
  AX_ASSERT_OK(ax_dataset_batch(ds2, idx, 50, &in2, &lb2));
  assert_memory_not_equal(ax_i32(in2.t[0]), ids, 50 * T * 4);
  ax_tlist_clear(&in2);
  ax_tlist_clear(&lb2);
  ax_dataset_close(ds2);
  ds2 = open_text(path, "vocab=50,seq=24,seed=9", 1);
  assert_int_equal(ax_dataset_size(ds2), 2000);
  assert_int_equal(ax_dataset_vocab(ds2), 50);
  ax_dataset_close(ds2);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  ax_dataset_close(ds);
  free(idx);
}

/* ---- the installed corpus ---- */

static void test_gcide_installed(void **state) {
  (void)state;
  struct stat st;
  if (stat(GCIDE, &st) != 0)
    skip(); /* package dict-gcide not installed */
  double t0 = ax_clock_s();
  ax_dataset *tr = open_text(GCIDE, "seq=64", 0);
  double t1 = ax_clock_s();
  ax_dataset *te = open_text(GCIDE, "seq=64", 1);
  const axi_corpus *c = axi_text_corpus(tr);
  print_message("gcide: train opens in %.2f s (%lld sentences, %lld tokens),"
                " test in %.2f s\n",
                t1 - t0, (long long)c->n_sent, (long long)c->start[c->n_sent],
                ax_clock_s() - t1);
  assert_true(t1 - t0 < 10.0);
  assert_int_equal(ax_dataset_vocab(tr), 8192);
  assert_int_equal(ax_dataset_vocab(te), 8192);
  assert_int_equal(ax_dataset_size(tr), 20000);
  assert_int_equal(ax_dataset_size(te), 2000);
  assert_true(c->n_sent > 50000);
  /* Frequent English words rank high; markup never becomes a token. */
  static const char *const common[] = {"the", "of", "a", "to", "and", "or"};
  for (int i = 0; i < 6; i++) {
    int id = ax_dataset_token_id(tr, common[i]);
    assert_true(id >= AX_TOK_SPECIALS && id < 40);
  }
  static const char *const never[] = {"{", "}", "[", "]", "\\", "<", ">"};
  for (int i = 0; i < 7; i++)
    assert_int_equal(ax_dataset_token_id(tr, never[i]), AX_TOK_UNK);
  /* Examples of the two splits: mostly known words. */
  for (int split = 0; split < 2; split++) {
    ax_dataset *ds = split ? te : tr;
    int64_t idx[16];
    for (int i = 0; i < 16; i++)
      idx[i] = i * 97;
    ax_tlist in = {0}, lb = {0};
    AX_ASSERT_OK(ax_dataset_batch(ds, idx, 16, &in, &lb));
    long words = 0, unk = 0;
    for (int i = 0; i < 16 * 64; i++) {
      int32_t y = ax_i32(lb.t[0])[i], x = ax_i32(in.t[0])[i];
      int orig = y != AX_MLM_IGNORE ? y : x;
      words += orig >= AX_TOK_SPECIALS || orig == AX_TOK_UNK;
      unk += orig == AX_TOK_UNK;
    }
    assert_true(words > 16 * 8 && unk < words / 5);
    char line[1024] = "";
    for (int t = 0; t < 64 && ax_i32(in.t[0])[t] != AX_TOK_PAD; t++)
      snprintf(line + strlen(line), sizeof line - strlen(line), "%s ",
               ax_dataset_token(ds, ax_i32(in.t[0])[t]));
    print_message("%s example 0 (nsp %d): %s\n", split ? "test" : "train",
                  ax_i32(lb.t[1])[0], line);
    ax_tlist_clear(&in);
    ax_tlist_clear(&lb);
  }
  ax_dataset_close(te);
  ax_dataset_close(tr);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_clean),
      cmocka_unit_test(test_tokenizer),
      cmocka_unit_test(test_examples),
      cmocka_unit_test(test_gcide_installed),
  };
  int failed = setup(NULL);
  if (failed == 0) {
    failed = AX_TEST_MAIN(t);
    teardown(NULL);
  }
  return failed;
}
