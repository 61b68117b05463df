/* The sampler and the decoding loop of models/generate.h: greedy picks,
 * temperature and top-k, the same seed giving the same tokens, and the
 * loop's calls to its decoder (a fake one here; the models' decoders are
 * checked in test_generate.c). */
#include <stdlib.h>
#include <string.h>

#include "axon/models/generate.h"
#include "tests/harness.h"

static void test_greedy(void **state) {
  (void)state;
  ax_sampler s;
  AX_ASSERT_OK(ax_sampler_init(&s, 0, 0, 1));
  float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  int32_t t = -1;
  AX_ASSERT_OK(ax_sample(&s, l, 5, &t));
  assert_int_equal(t, 1); /* the tie goes to the lower index */
  /* top-k 1 is greedy at any temperature */
  AX_ASSERT_OK(ax_sampler_init(&s, 5.0, 1, 2));
  for (int i = 0; i < 50; i++) {
    AX_ASSERT_OK(ax_sample(&s, l, 5, &t));
    assert_int_equal(t, 1);
  }
}

static void test_same_seed_same_tokens(void **state) {
  (void)state;
  float l[50];
  for (int i = 0; i < 50; i++)
    l[i] = (float)((i * 37) % 11) * 0.3f;
  ax_sampler a, b, c;
  AX_ASSERT_OK(ax_sampler_init(&a, 0.8, 0, 42));
  AX_ASSERT_OK(ax_sampler_init(&b, 0.8, 0, 42));
  AX_ASSERT_OK(ax_sampler_init(&c, 0.8, 0, 43));
  int differ = 0;
  for (int i = 0; i < 200; i++) {
    int32_t x, y, z;
    AX_ASSERT_OK(ax_sample(&a, l, 50, &x));
    AX_ASSERT_OK(ax_sample(&b, l, 50, &y));
    AX_ASSERT_OK(ax_sample(&c, l, 50, &z));
    assert_int_equal(x, y);
    assert_true(x >= 0 && x < 50);
    differ += x != z;
  }
  assert_true(differ > 50); /* another seed, other tokens */
}

/* The frequencies follow softmax(logits / T) over the candidates. */
static void test_distribution(void **state) {
  (void)state;
  float l[4] = {0.0f, logf(3.0f), -1e9f, logf(6.0f)};
  ax_sampler s;
  AX_ASSERT_OK(ax_sampler_init(&s, 1.0, 0, 7));
  int n = 40000, hit[4] = {0};
  for (int i = 0; i < n; i++) {
    int32_t t;
    AX_ASSERT_OK(ax_sample(&s, l, 4, &t));
    hit[t]++;
  }
  AX_ASSERT_CLOSE(hit[0] / (double)n, 0.1, 0.01, 0);
  AX_ASSERT_CLOSE(hit[1] / (double)n, 0.3, 0.01, 0);
  assert_int_equal(hit[2], 0);
  AX_ASSERT_CLOSE(hit[3] / (double)n, 0.6, 0.01, 0);
  /* T = 2 flattens: probabilities proportional to sqrt(1, 3, 6) */
  AX_ASSERT_OK(ax_sampler_init(&s, 2.0, 0, 8));
  memset(hit, 0, sizeof hit);
  for (int i = 0; i < n; i++) {
    int32_t t;
    AX_ASSERT_OK(ax_sample(&s, l, 4, &t));
    hit[t]++;
  }
  double z = 1 + sqrt(3.0) + sqrt(6.0);
  AX_ASSERT_CLOSE(hit[0] / (double)n, 1 / z, 0.01, 0);
  AX_ASSERT_CLOSE(hit[3] / (double)n, sqrt(6.0) / z, 0.01, 0);
}

/* Top-k keeps the k largest logits and renormalises over them. */
static void test_top_k(void **state) {
  (void)state;
  float l[6] = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f, 2.5f};
  ax_sampler s;
  AX_ASSERT_OK(ax_sampler_init(&s, 1.0, 2, 9));
  int n = 20000, hit[6] = {0};
  for (int i = 0; i < n; i++) {
    int32_t t;
    AX_ASSERT_OK(ax_sample(&s, l, 6, &t));
    hit[t]++;
  }
  assert_int_equal(hit[0] + hit[2] + hit[4] + hit[5], 0);
  AX_ASSERT_CLOSE(hit[1] / (double)n, 0.5, 0.015, 0);
  /* k >= vocab is every token */
  AX_ASSERT_OK(ax_sampler_init(&s, 1.0, 100, 9));
  memset(hit, 0, sizeof hit);
  for (int i = 0; i < n; i++) {
    int32_t t;
    AX_ASSERT_OK(ax_sample(&s, l, 6, &t));
    hit[t]++;
  }
  for (int i = 0; i < 6; i++)
    assert_true(hit[i] > 0);
}

static void test_refusals(void **state) {
  (void)state;
  ax_sampler s;
  AX_ASSERT_ERR(ax_sampler_init(&s, -1, 0, 1), AX_EINVAL);
  AX_ASSERT_ERR(ax_sampler_init(&s, NAN, 0, 1), AX_EINVAL);
  AX_ASSERT_ERR(ax_sampler_init(&s, 1, -2, 1), AX_EINVAL);
  AX_ASSERT_OK(ax_sampler_init(&s, 1, 0, 1));
  float l[3] = {0, NAN, 1};
  int32_t t;
  AX_ASSERT_ERR(ax_sample(&s, l, 3, &t), AX_EINVAL);
  AX_ASSERT_ERR(ax_sample(&s, l, 0, &t), AX_EINVAL);
}

/* A decoder of 8 tokens whose logits favour (last token + 1) mod 8, which
 * records what it was asked. */
typedef struct fake {
  int calls;
  int64_t pos[16];
  int n[16];
  int32_t first[16];
} fake;

static int fake_decode(void *user, int64_t pos, const int32_t *ids, int n,
                       ax_tensor **logits) {
  fake *f = user;
  f->pos[f->calls] = pos;
  f->n[f->calls] = n;
  f->first[f->calls++] = ids[0];
  *logits = ax_tensor_zeros(AX_F32, 1, (int64_t[]){8}, AX_CPU);
  ax_f32(*logits)[(ids[n - 1] + 1) % 8] = 5.0f;
  return AX_OK;
}

static void emit_count(void *user, int32_t tok) { (*(int *)user)++; }

static void test_loop(void **state) {
  (void)state;
  fake f = {0};
  ax_sampler s;
  AX_ASSERT_OK(ax_sampler_init(&s, 0, 0, 1));
  int32_t prompt[3] = {4, 2, 6}, out[5];
  int emitted = 0;
  AX_ASSERT_OK(ax_generate(fake_decode, &f, prompt, 3, 5, &s, out, emit_count,
                           &emitted));
  assert_int_equal(emitted, 5);
  assert_int_equal(f.calls, 5);
  int32_t want[5] = {7, 0, 1, 2, 3};
  for (int i = 0; i < 5; i++)
    assert_int_equal(out[i], want[i]);
  /* the prompt at 0, then one token at a time at its position */
  assert_int_equal(f.pos[0], 0);
  assert_int_equal(f.n[0], 3);
  assert_int_equal(f.first[0], 4);
  for (int i = 1; i < 5; i++) {
    assert_int_equal(f.pos[i], 2 + i);
    assert_int_equal(f.n[i], 1);
    assert_int_equal(f.first[i], want[i - 1]);
  }
  AX_ASSERT_ERR(ax_generate(fake_decode, &f, prompt, 0, 5, &s, out, NULL, NULL),
                AX_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_same_seed_same_tokens),
      cmocka_unit_test(test_distribution),
      cmocka_unit_test(test_top_k),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_loop),
  };
  return AX_TEST_MAIN(tests);
}
