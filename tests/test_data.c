/* Data sets: IDX and CIFAR-10 readers on files the test writes, their error
 * reporting, and the installed Fashion-MNIST. The synthetic set and the
 * loader are in test_loader.c. */
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

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define MEAN 0.2860f
#define STD 0.3530f

/* ---- helpers ---- */

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* An IDX image file of n 28x28 images (bytes from seed) and its labels.
 * extra_bytes is added to (or, negative, cut from) the image data. */
static void write_idx_pair(const char *dir, const char *prefix, int n,
                           uint32_t img_magic, int extra_bytes, int gz,
                           unsigned char *pixels, unsigned char *labels) {
  size_t isz = 16 + (size_t)n * 784, lsz = 8 + (size_t)n;
  unsigned char *img = calloc(1, isz + 64), *lab = calloc(1, lsz);
  put_be32(img, img_magic), put_be32(img + 4, (uint32_t)n);
  put_be32(img + 8, 28), put_be32(img + 12, 28);
  put_be32(lab, 0x801), put_be32(lab + 4, (uint32_t)n);
  for (size_t i = 0; i < (size_t)n * 784; i++)
    img[16 + i] = pixels[i] = (unsigned char)((i * 2654435761u) >> 13);
  for (int i = 0; i < n; i++)
    lab[8 + i] = labels[i] = (unsigned char)((i * 7 + 3) % 10);
  char iname[96], lname[96];
  snprintf(iname, sizeof iname, "%s-images-idx3-ubyte%s", prefix,
           gz ? ".gz" : "");
  snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte%s", prefix,
           gz ? ".gz" : "");
  ax_test_write_file(dir, iname, img, (size_t)((long)isz + extra_bytes), gz);
  ax_test_write_file(dir, lname, lab, lsz, gz);
  free(img);
  free(lab);
}

static int open_dir(const char *name, const char *dir, const char *extra,
                    int split, ax_dataset **ds) {
  char s[400];
  snprintf(s, sizeof s, "dir=%s%s%s", dir, extra ? "," : "",
           extra ? extra : "");
  ax_config cfg;
  int rc = ax_config_parse(&cfg, s);
  return rc ? rc : ax_dataset_open(name, &cfg, split, ds);
}

static int64_t *iota(int64_t n) {
  int64_t *v = malloc(sizeof *v * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    v[i] = i;
  return v;
}

static unsigned char raw_pixel(float x) {
  return (unsigned char)lrintf((x * STD + MEAN) * 255.0f);
}

/* ---- IDX ---- */

static void test_idx_roundtrip(void **state) {
  (void)state;
  char dir[64];
  ax_test_mkdtemp(dir, "data");
  unsigned char px[5 * 784], lab[5], px2[5 * 784], lab2[5];
  write_idx_pair(dir, "train", 5, 0x803, 0, 1, px, lab);
  write_idx_pair(dir, "t10k", 5, 0x803, 0, 0, px2, lab2); /* plain files */
  for (int split = 0; split < 2; split++) {
    ax_dataset *ds;
    AX_ASSERT_OK(open_dir("fashion-mnist", dir, NULL, split, &ds));
    assert_int_equal(ax_dataset_size(ds), 5);
    assert_int_equal(ax_dataset_classes(ds), 10);
    assert_int_equal(ax_dataset_vocab(ds), 0);
    int64_t idx[3] = {4, 0, 2};
    ax_tlist in = {0}, lb = {0};
    AX_ASSERT_OK(ax_dataset_batch(ds, idx, 3, &in, &lb));
    int64_t dims[4] = {3, 1, 28, 28};
    AX_ASSERT_OK(ax_tensor_check(in.t[0], "x", AX_F32, 4, dims));
    AX_ASSERT_OK(ax_tensor_check(lb.t[0], "y", AX_I32, 1, dims));
    for (int b = 0; b < 3; b++) {
      assert_int_equal(ax_i32(lb.t[0])[b], lab[idx[b]]);
      for (int i = 0; i < 784; i++)
        assert_int_equal(raw_pixel(ax_f32(in.t[0])[b * 784 + i]),
                         px[idx[b] * 784 + i]);
    }
    ax_tlist_clear(&in);
    ax_tlist_clear(&lb);
    ax_dataset_close(ds);
  }
  /* limit and pad. */
  ax_dataset *ds;
  AX_ASSERT_OK(open_dir("fashion-mnist", dir, "limit=3,pad=1", 0, &ds));
  assert_int_equal(ax_dataset_size(ds), 3);
  int64_t idx[1] = {1}, dims[4] = {1, 1, 32, 32};
  ax_tlist in = {0}, lb = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds, idx, 1, &in, &lb));
  AX_ASSERT_OK(ax_tensor_check(in.t[0], "x", AX_F32, 4, dims));
  const float *x = ax_f32(in.t[0]);
  for (int r = 0; r < 32; r++)
    for (int c = 0; c < 32; c++) {
      float v = x[r * 32 + c];
      if (r < 2 || r >= 30 || c < 2 || c >= 30)
        AX_ASSERT_CLOSE(v, -MEAN / STD, 1e-6, 0);
      else
        assert_int_equal(raw_pixel(v), px[784 + (r - 2) * 28 + c - 2]);
    }
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  int64_t bad[1] = {3};
  AX_ASSERT_ERR(ax_dataset_batch(ds, bad, 1, &in, &lb), AX_EINVAL);
  ax_dataset_close(ds);
  ax_test_rmtree(dir);
}

static void expect_format_error(const char *dir, const char *what) {
  ax_dataset *ds = NULL;
  AX_ASSERT_ERR(open_dir("fashion-mnist", dir, NULL, 0, &ds), AX_EFORMAT);
  assert_null(ds);
  if (!strstr(ax_errmsg(), what))
    fail_msg("message '%s' does not name %s", ax_errmsg(), what);
}

static void test_idx_errors(void **state) {
  (void)state;
  char dir[64];
  ax_test_mkdtemp(dir, "data");
  unsigned char px[4 * 784], lab[4];
  ax_dataset *ds = NULL;
  AX_ASSERT_ERR(open_dir("fashion-mnist", dir, NULL, 0, &ds), AX_ENOTFOUND);
  assert_non_null(strstr(ax_errmsg(), "train-labels-idx1-ubyte"));
  write_idx_pair(dir, "train", 4, 0x803, -100, 1, px, lab); /* short */
  expect_format_error(dir, "train-images-idx3-ubyte.gz");
  assert_non_null(strstr(ax_errmsg(), "truncated"));
  write_idx_pair(dir, "train", 4, 0x803, 7, 1, px, lab); /* trailing */
  expect_format_error(dir, "train-images-idx3-ubyte.gz");
  write_idx_pair(dir, "train", 4, 0x1234, 0, 1, px, lab); /* bad magic */
  expect_format_error(dir, "train-images-idx3-ubyte.gz");
  assert_non_null(strstr(ax_errmsg(), "magic"));
  /* A gzip stream cut short. */
  write_idx_pair(dir, "train", 4, 0x803, 0, 1, px, lab);
  char path[128];
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(truncate(path, st.st_size / 2), 0);
  expect_format_error(dir, "train-images-idx3-ubyte.gz");
  /* Garbage that is not gzip reads as plain bytes and fails the magic. */
  ax_test_write_file(dir, "train-images-idx3-ubyte.gz",
                     "garbage!garbage!garbage!", 24, 0);
  expect_format_error(dir, "train-images-idx3-ubyte.gz");
  /* Image and label counts that disagree. */
  write_idx_pair(dir, "train", 4, 0x803, 0, 1, px, lab);
  unsigned char lab3[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3};
  ax_test_write_file(dir, "train-labels-idx1-ubyte.gz", lab3, sizeof lab3, 1);
  expect_format_error(dir, "labels");
  ax_test_rmtree(dir);
  AX_ASSERT_ERR(open_dir("no-such-set", dir, NULL, 0, &ds), AX_ENOTFOUND);
}

/* ---- CIFAR-10 ---- */

static const float cmean[3] = {0.4914f, 0.4822f, 0.4465f};
static const float cstd[3] = {0.2470f, 0.2435f, 0.2616f};

static void fill_records(unsigned char *rec, int n, int salt) {
  for (int r = 0; r < n; r++) {
    rec[r * 3073] = (unsigned char)((r + salt) % 10);
    for (int i = 0; i < 3072; i++)
      rec[r * 3073 + 1 + i] = (unsigned char)((i * 31 + r * 7 + salt) & 255);
  }
}

static void test_cifar(void **state) {
  (void)state;
  char dir[64];
  ax_test_mkdtemp(dir, "data");
  unsigned char rec[3 * 3073];
  fill_records(rec, 3, 0);
  ax_test_write_file(dir, "test_batch.bin", rec, sizeof rec, 0);
  ax_dataset *ds;
  AX_ASSERT_OK(open_dir("cifar10", dir, NULL, AX_SPLIT_TEST, &ds));
  assert_int_equal(ax_dataset_size(ds), 3);
  int64_t idx[2] = {2, 1}, dims[4] = {2, 3, 32, 32};
  ax_tlist in = {0}, lb = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds, idx, 2, &in, &lb));
  AX_ASSERT_OK(ax_tensor_check(in.t[0], "x", AX_F32, 4, dims));
  assert_int_equal(ax_i32(lb.t[0])[0], 2);
  assert_int_equal(ax_i32(lb.t[0])[1], 1);
  /* Example 2, green channel, row 5, column 7. */
  int c = 1, off = c * 1024 + 5 * 32 + 7;
  float want = ((float)rec[2 * 3073 + 1 + off] / 255.0f - cmean[c]) / cstd[c];
  AX_ASSERT_CLOSE(ax_f32(in.t[0])[off], want, 1e-6, 0);
  for (int i = 0; i < 3072; i++) {
    int ch = i / 1024;
    float w = ((float)rec[3073 + 1 + i] / 255.0f - cmean[ch]) / cstd[ch];
    AX_ASSERT_CLOSE(ax_f32(in.t[0])[3072 + i], w, 1e-6, 0);
  }
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  ax_dataset_close(ds);
  /* Train: five gzip batch files of two records each, read in order. */
  AX_ASSERT_ERR(open_dir("cifar10", dir, NULL, AX_SPLIT_TRAIN, &ds),
                AX_ENOTFOUND);
  assert_non_null(strstr(ax_errmsg(), "data_batch_1.bin"));
  for (int f = 1; f <= 5; f++) {
    char name[32];
    snprintf(name, sizeof name, "data_batch_%d.bin.gz", f);
    fill_records(rec, 2, f * 2);
    ax_test_write_file(dir, name, rec, 2 * 3073, 1);
  }
  AX_ASSERT_OK(open_dir("cifar10", dir, NULL, AX_SPLIT_TRAIN, &ds));
  assert_int_equal(ax_dataset_size(ds), 10);
  int64_t *all = iota(10);
  AX_ASSERT_OK(ax_dataset_batch(ds, all, 10, &in, &lb));
  for (int i = 0; i < 10; i++) /* record r of file f has label r + 2f */
    assert_int_equal(ax_i32(lb.t[0])[i], (i % 2 + (i / 2 + 1) * 2) % 10);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  ax_dataset_close(ds);
  free(all);
  /* A partial record is a format error naming the file. */
  ax_test_write_file(dir, "test_batch.bin", rec, 3073 + 100, 0);
  AX_ASSERT_ERR(open_dir("cifar10", dir, NULL, AX_SPLIT_TEST, &ds), AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), "test_batch.bin"));
  rec[0] = 10; /* a label out of range */
  ax_test_write_file(dir, "test_batch.bin", rec, 3073, 0);
  AX_ASSERT_ERR(open_dir("cifar10", dir, NULL, AX_SPLIT_TEST, &ds), AX_EFORMAT);
  ax_test_rmtree(dir);
}

/* ---- the installed Fashion-MNIST ---- */

static void test_fmnist_installed(void **state) {
  (void)state;
  struct stat st;
  if (stat(FMNIST_DIR "/train-images-idx3-ubyte.gz", &st) != 0)
    skip(); /* package dataset-fashion-mnist not installed */
  ax_dataset *tr, *te;
  double t0 = ax_clock_s();
  AX_ASSERT_OK(ax_dataset_open("fashion-mnist", NULL, 0, &tr));
  double t1 = ax_clock_s();
  AX_ASSERT_OK(ax_dataset_open("fashion-mnist", NULL, 1, &te));
  print_message("fashion-mnist: train opens in %.2f s, test in %.2f s\n",
                t1 - t0, ax_clock_s() - t1);
  assert_int_equal(ax_dataset_size(tr), 60000);
  assert_int_equal(ax_dataset_size(te), 10000);
  /* Class counts, and the pixel statistics the normalisation assumes. */
  int64_t counts[10] = {0}, chunk = 10000;
  int64_t *idx = iota(chunk);
  double sum = 0, sum2 = 0;
  for (int64_t start = 0; start < 60000; start += chunk) {
    for (int64_t i = 0; i < chunk; i++)
      idx[i] = start + i;
    ax_tlist in = {0}, lb = {0};
    AX_ASSERT_OK(ax_dataset_batch(tr, idx, chunk, &in, &lb));
    for (int64_t i = 0; i < chunk; i++) {
      int32_t y = ax_i32(lb.t[0])[i];
      assert_true(y >= 0 && y < 10);
      counts[y]++;
    }
    const float *x = ax_f32(in.t[0]);
    for (int64_t i = 0; i < chunk * 784; i++) {
      double v = raw_pixel(x[i]) / 255.0;
      sum += v, sum2 += v * v;
    }
    ax_tlist_clear(&in);
    ax_tlist_clear(&lb);
  }
  for (int c = 0; c < 10; c++)
    assert_int_equal(counts[c], 6000);
  double n = 60000.0 * 784, mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
  AX_ASSERT_CLOSE(mean, 0.2860, 1e-4, 0);
  AX_ASSERT_CLOSE(sd, 0.3530, 1e-4, 0);
  /* The first training image: an ankle boot with a known checksum. */
  ax_tlist in = {0}, lb = {0};
  idx[0] = 0;
  AX_ASSERT_OK(ax_dataset_batch(tr, idx, 1, &in, &lb));
  assert_int_equal(ax_i32(lb.t[0])[0], 9);
  uint32_t h = 2166136261u, bytesum = 0;
  for (int i = 0; i < 784; i++) {
    unsigned char b = raw_pixel(ax_f32(in.t[0])[i]);
    h = (h ^ b) * 16777619u;
    bytesum += b;
  }
  assert_int_equal(h, 0xf365a098u);
  assert_int_equal(bytesum, 76247);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  for (int64_t i = 0; i < 10000; i++)
    idx[i] = i;
  AX_ASSERT_OK(ax_dataset_batch(te, idx, 10000, &in, &lb));
  for (int64_t i = 0; i < 10000; i++)
    assert_true(ax_i32(lb.t[0])[i] >= 0 && ax_i32(lb.t[0])[i] < 10);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  ax_dataset_close(te);
  /* pad=1: (B, 1, 32, 32) with the 28x28 image in the centre. */
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, "pad=1,limit=100"));
  AX_ASSERT_OK(ax_dataset_open("fashion-mnist", &cfg, 0, &te));
  assert_int_equal(ax_dataset_size(te), 100);
  int64_t two[2] = {0, 99}, dims[4] = {2, 1, 32, 32};
  ax_tlist pin = {0}, plb = {0};
  AX_ASSERT_OK(ax_dataset_batch(te, two, 2, &pin, &plb));
  AX_ASSERT_OK(ax_dataset_batch(tr, two, 2, &in, &lb));
  AX_ASSERT_OK(ax_tensor_check(pin.t[0], "x", AX_F32, 4, dims));
  for (int b = 0; b < 2; b++)
    for (int r = 0; r < 32; r++)
      for (int c = 0; c < 32; c++) {
        float v = ax_f32(pin.t[0])[b * 1024 + r * 32 + c];
        float w = (r < 2 || r >= 30 || c < 2 || c >= 30)
                      ? -MEAN / STD
                      : ax_f32(in.t[0])[b * 784 + (r - 2) * 28 + c - 2];
        assert_true(v == w);
      }
  ax_tlist_clear(&pin);
  ax_tlist_clear(&plb);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  ax_dataset_close(te);
  ax_dataset_close(tr);
  free(idx);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_idx_roundtrip),
      cmocka_unit_test(test_idx_errors),
      cmocka_unit_test(test_cifar),
      cmocka_unit_test(test_fmnist_installed),
  };
  return AX_TEST_MAIN(t);
}
