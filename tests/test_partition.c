/* The partitioner (runtime/pipeline/schedule/partition.h): stash counts, the DP
 * against brute force, the memory cap, uniform splits, and real profiling
 * of ResNet20 split at K = 2, 3, 4, 6, 11. */
#include <stdio.h>
#include <string.h>

#include "axon/kernels/rng.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include "harness.h"

static void stash_table(void **state) {
  (void)state;
  ax_stash_count c;
  int K = 4, M = 8;
  for (int k = 1; k <= K; k++) {
    int d = K - k;
    AX_ASSERT_OK(ax_pipe_stash("sequential", K, k, M, 0, &c));
    assert_true(c.sets == 1 && c.activation_sets == 1 &&
                c.weight_versions == 1);
    AX_ASSERT_OK(ax_pipe_stash("gpipe", K, k, M, AX_RECOMPUTE_NEVER, &c));
    assert_true(c.sets == M && c.activation_sets == M && !c.replay);
    AX_ASSERT_OK(ax_pipe_stash("gpipe", K, k, M, AX_RECOMPUTE_ALWAYS, &c));
    assert_true(c.sets == M && c.activation_sets == 0 && c.replay);
    AX_ASSERT_OK(ax_pipe_stash("gpipe", K, k, M, AX_RECOMPUTE_EXCEPT_LAST, &c));
    assert_true(c.sets == M && c.activation_sets == 1 && c.replay);
    AX_ASSERT_OK(ax_pipe_stash("1f1b", K, k, M, 0, &c));
    assert_int_equal(c.sets, K - k + 1);
    assert_int_equal(c.weight_versions, 1);
    AX_ASSERT_OK(ax_pipe_stash("1f1b", K, k, 2, 0, &c));
    assert_int_equal(c.sets, K - k + 1 < 2 ? K - k + 1 : 2);
    AX_ASSERT_OK(ax_pipe_stash("ddg", K, k, M, 0, &c));
    assert_true(c.sets == d + 1 && c.activation_sets == d + 1 &&
                c.weight_versions == d + 1);
    AX_ASSERT_OK(ax_pipe_stash("fr", K, k, M, 0, &c));
    assert_true(c.sets == d + 1 && c.activation_sets == 0 &&
                c.weight_versions == 1 && c.replay);
    AX_ASSERT_OK(ax_pipe_stash("pipedream", K, k, M, 0, &c));
    assert_true(c.sets == d + 1 && c.weight_versions == d + 1);
  }
  AX_ASSERT_ERR(ax_pipe_stash("pipedream", 4, 0, 1, 0, &c), AX_EINVAL);
  AX_ASSERT_ERR(ax_pipe_stash("pipedream", 4, 5, 1, 0, &c), AX_EINVAL);
  AX_ASSERT_ERR(ax_pipe_stash("gpipe", 4, 1, 0, 0, &c), AX_EINVAL);
  AX_ASSERT_ERR(ax_pipe_stash("bogus", 4, 1, 1, 0, &c), AX_EINVAL);
}

static void random_profile(ax_rng *r, ax_block_profile *p, int n) {
  for (int i = 0; i < n; i++) {
    memset(&p[i], 0, sizeof p[i]);
    p[i].fwd_s = ax_rng_uniform(r);
    p[i].bwd_s = 2 * ax_rng_uniform(r);
    p[i].out_bytes = (size_t)ax_rng_below(r, 1000);
    p[i].in_bytes = i ? p[i - 1].out_bytes : 500;
    p[i].param_bytes = (size_t)ax_rng_below(r, 1000);
    p[i].saved_bytes = (size_t)ax_rng_below(r, 1000);
  }
}

/* The best objective over every split, by enumeration of cut points. */
static double brute(const ax_block_profile *p, int n,
                    const ax_partition_opts *o, int s, int first,
                    double worst) {
  if (s == o->K - 1) {
    if (o->mem_cap && ax_stage_memory(p, n, first, n, s, o) > o->mem_cap)
      return INFINITY;
    double t = ax_stage_time(p, n, first, n, o);
    return t > worst ? t : worst;
  }
  double best = INFINITY;
  for (int end = first + 1; end <= n - (o->K - 1 - s); end++) {
    if (o->mem_cap && ax_stage_memory(p, n, first, end, s, o) > o->mem_cap)
      continue;
    double t = ax_stage_time(p, n, first, end, o);
    double v = brute(p, n, o, s + 1, end, t > worst ? t : worst);
    if (v < best)
      best = v;
  }
  return best;
}

static void dp_matches_brute_force(void **state) {
  (void)state;
  ax_rng r;
  ax_rng_seed(&r, 11);
  const char *modes[] = {"sequential", "gpipe", "1f1b", "pipedream", "fr"};
  ax_block_profile p[12];
  int tested = 0, infeasible = 0;
  for (int trial = 0; trial < 300; trial++) {
    int n = 1 + (int)ax_rng_below(&r, 12);
    random_profile(&r, p, n);
    ax_partition_opts o = {0};
    o.K = 1 + (int)ax_rng_below(&r, (uint64_t)n);
    o.mode = modes[trial % 5];
    o.M = 4;
    o.bandwidth_Bps = trial % 2 ? 2000.0 : 0;
    o.mem_cap = trial % 3 ? 0 : 2000 + (size_t)ax_rng_below(&r, 8000);
    int bounds[13];
    ax_partition_report rep;
    double want = brute(p, n, &o, 0, 0, 0);
    int rc = ax_partition_balanced(p, n, &o, bounds, &rep);
    if (want == INFINITY) {
      AX_ASSERT_ERR(rc, AX_EINVAL);
      assert_non_null(strstr(ax_errmsg(), "memory cap"));
      infeasible++;
      continue;
    }
    AX_ASSERT_OK(rc);
    assert_true(bounds[0] == 0 && bounds[o.K] == n);
    for (int s = 0; s < o.K; s++) {
      assert_true(bounds[s] < bounds[s + 1]);
      if (o.mem_cap)
        assert_true(rep.stage_mem[s] <= o.mem_cap);
    }
    if (rep.max_time != want)
      fail_msg("trial %d (n=%d K=%d %s): DP %.12g, brute force %.12g", trial, n,
               o.K, o.mode, rep.max_time, want);
    tested++;
  }
  assert_true(tested > 150);
  assert_true(infeasible > 0);
}

static void memory_cap_rejection(void **state) {
  (void)state;
  /* Four equal blocks: 100 bytes of parameters and 1000 saved bytes each. */
  ax_block_profile p[4];
  memset(p, 0, sizeof p);
  for (int i = 0; i < 4; i++) {
    p[i].fwd_s = 1, p[i].bwd_s = 2;
    p[i].param_bytes = 100, p[i].saved_bytes = 1000, p[i].in_bytes = 10;
  }
  ax_partition_opts o = {0};
  o.K = 2;
  o.mode = "pipedream";
  int b[3];
  /* Stage 1 (k = 1 of 2) keeps 2 activation sets and 2 weight versions. */
  assert_int_equal(ax_stage_memory(p, 4, 0, 2, 0, &o), 200 * 3 + 2000 * 2);
  assert_int_equal(ax_stage_memory(p, 4, 2, 4, 1, &o), 200 * 2 + 2000);
  o.mem_cap = 4600;
  AX_ASSERT_OK(ax_partition_balanced(p, 4, &o, b, NULL));
  assert_true(b[1] == 2);
  /* 4599 bytes: the balanced split no longer fits; 1/3 does. */
  o.mem_cap = 4599;
  AX_ASSERT_OK(ax_partition_balanced(p, 4, &o, b, NULL));
  assert_int_equal(b[1], 1);
  o.mem_cap = 1000;
  AX_ASSERT_ERR(ax_partition_balanced(p, 4, &o, b, NULL), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "memory cap"));
  /* FR keeps only inputs: the same cap fits. */
  o.mode = "fr";
  o.mem_cap = 2500;
  AX_ASSERT_OK(ax_partition_balanced(p, 4, &o, b, NULL));
  /* K larger than the block count. */
  o.K = 5;
  o.mem_cap = 0;
  AX_ASSERT_ERR(ax_partition_balanced(p, 4, &o, b, NULL), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "cannot split"));
}

/* A slow link between two blocks moves the cut away from it: the stage
 * boundary goes where the activation is small or the link fast. */
static void slow_link_moves_the_cut(void **state) {
  (void)state;
  ax_block_profile p[4] = {{0}};
  for (int i = 0; i < 4; i++) {
    p[i].fwd_s = p[i].bwd_s = 0.01;
    p[i].out_bytes = 1000;
    p[i].in_bytes = 1000;
    p[i].param_bytes = 100;
  }
  int b[5];
  ax_partition_opts o = {0};
  o.K = 2;
  o.mode = "gpipe";
  AX_ASSERT_OK(ax_partition_balanced(p, 4, &o, b, NULL));
  assert_int_equal(b[1], 2); /* even split without links */
  /* Block 1's output is large: crossing after it costs 30 ms at 1 MB/s,
   * more than an uneven split (20 ms): the cut moves to 1 (ties go to the
   * earliest), and the slower stage pays the latency and block 0's bytes. */
  p[1].out_bytes = 30000;
  double lat[1] = {0.0005}, Bps[1] = {1e6};
  o.link_lat_s = lat;
  o.link_Bps = Bps;
  ax_partition_report rep;
  AX_ASSERT_OK(ax_partition_balanced(p, 4, &o, b, &rep));
  assert_int_equal(b[1], 1);
  AX_ASSERT_CLOSE(rep.max_time, 0.06 + 0.0005 + 0.001, 1e-9, 0);
  /* a fast link leaves the even split */
  Bps[0] = 1e12;
  AX_ASSERT_OK(ax_partition_balanced(p, 4, &o, b, NULL));
  assert_int_equal(b[1], 2);
  /* without links, the stage-agnostic time ignores them */
  AX_ASSERT_CLOSE(ax_stage_time(p, 4, 0, 2, &o), 0.04, 1e-12, 0);
}

static void uniform_splits(void **state) {
  (void)state;
  int b[12];
  char buf[64];
  AX_ASSERT_OK(ax_partition_uniform(11, 4, b));
  assert_string_equal(ax_partition_format(b, 4, buf, sizeof buf), "0/2/5/8/11");
  AX_ASSERT_OK(ax_partition_uniform(11, 11, b));
  for (int s = 0; s <= 11; s++)
    assert_int_equal(b[s], s);
  AX_ASSERT_OK(ax_partition_uniform(5, 1, b));
  assert_string_equal(ax_partition_format(b, 1, buf, sizeof buf), "0/5");
  AX_ASSERT_ERR(ax_partition_uniform(3, 4, b), AX_EINVAL);
  AX_ASSERT_ERR(ax_partition_uniform(3, 0, b), AX_EINVAL);
  assert_string_equal(ax_partition_format(b, 1, buf, 3), "");
}

static void resnet20_balanced(void **state) {
  (void)state;
  const ax_model_def *def = ax_model_find("resnet20");
  assert_non_null(def);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, NULL, &cfg));
  int64_t shape[4] = {4, 1, 32, 32};
  ax_tensor *x = ax_test_randn(3, 1.0f, 4, shape);
  ax_tlist in = ax_tlist1(x);
  ax_block_profile p[AX_MODEL_MAX_BLOCKS];
  int n = 0;
  ax_profile_opts po = {1, 3, 1};
  AX_ASSERT_OK(ax_profile_blocks(def, &cfg, AX_CPU, &in, &po, p, &n));
  assert_int_equal(n, 11);
  for (int i = 0; i < n; i++) {
    assert_true(p[i].fwd_s > 0 && p[i].bwd_s > 0);
    assert_true(p[i].out_bytes > 0 && p[i].param_bytes > 0);
    assert_true(p[i].saved_bytes > 0);
    if (i > 0)
      assert_int_equal(p[i].in_bytes, p[i - 1].out_bytes);
  }
  assert_int_equal(p[0].in_bytes, 4 * 32 * 32 * 4);
  assert_int_equal(p[0].out_bytes, 4 * 16 * 32 * 32 * 4);
  assert_int_equal(p[10].out_bytes, 4 * 10 * 4);
  const int Ks[] = {2, 3, 4, 6, 11};
  for (int i = 0; i < 5; i++) {
    ax_partition_opts o = {0};
    o.K = Ks[i];
    o.mode = "pipedream";
    o.bandwidth_Bps = 1e9;
    int b[12];
    char buf[64];
    ax_partition_report rep;
    AX_ASSERT_OK(ax_partition_balanced(p, n, &o, b, &rep));
    double total = 0;
    for (int j = 0; j < n; j++)
      total += p[j].fwd_s + p[j].bwd_s;
    /* The slowest stage is at least the mean stage. */
    assert_true(rep.max_time >= total / o.K * (1 - 1e-9));
    /* And no worse than the uniform split's. */
    int u[12];
    AX_ASSERT_OK(ax_partition_uniform(n, o.K, u));
    double worst_u = 0;
    for (int s = 0; s < o.K; s++) {
      double t = ax_stage_time(p, n, u[s], u[s + 1], &o);
      worst_u = t > worst_u ? t : worst_u;
    }
    assert_true(rep.max_time <= worst_u);
    printf("  K=%-2d balanced %-24s slowest %.2f ms (uniform %.2f ms)\n", o.K,
           ax_partition_format(b, o.K, buf, sizeof buf), 1e3 * rep.max_time,
           1e3 * worst_u);
  }
  /* The one-call path. */
  ax_partition_opts o = {0};
  o.K = 3;
  int b[4];
  AX_ASSERT_OK(
      ax_partition_model("balanced", def, &cfg, AX_CPU, &in, &po, &o, b, NULL));
  AX_ASSERT_OK(ax_partition_model("uniform", def, &cfg, AX_CPU, NULL, NULL, &o,
                                  b, NULL));
  assert_true(b[1] == 3 && b[2] == 7);
  AX_ASSERT_ERR(
      ax_partition_model("greedy", def, &cfg, AX_CPU, &in, NULL, &o, b, NULL),
      AX_EINVAL);
  ax_tensor_release(x);
}

static void bert_layer_boundaries(void **state) {
  (void)state;
  const ax_model_def *def = ax_model_find("bert");
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(
      def, "layers=4,hidden=32,heads=2,ff=64,vocab=100,seq=8,dropout=0", &cfg));
  int64_t shape[2] = {2, 8};
  ax_tensor *ids = ax_test_randint(1, 0, 100, 2, shape);
  ax_tensor *seg = ax_test_randint(2, 0, 2, 2, shape);
  ax_tensor *mask = ax_tensor_new(AX_F32, 2, shape, AX_CPU); /* (B, S) */
  AX_ASSERT_OK(ax_tensor_fill(mask, 1.0f));
  ax_tlist in = {3, {ids, seg, mask}};
  ax_block_profile p[AX_MODEL_MAX_BLOCKS];
  int n = 0;
  int rc = ax_profile_blocks(def, &cfg, AX_CPU, &in, NULL, p, &n);
  if (rc != AX_OK)
    fail_msg("bert profile: %s: %s", ax_errname(rc), ax_errmsg());
  assert_int_equal(n, 6);
  ax_partition_opts o = {0};
  o.K = 3;
  o.mode = "gpipe";
  o.M = 4;
  int b[4];
  AX_ASSERT_OK(ax_partition_balanced(p, n, &o, b, NULL));
  assert_true(b[0] == 0 && b[3] == 6 && b[1] < b[2]);
  ax_tensor_release(ids);
  ax_tensor_release(seg);
  ax_tensor_release(mask);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(stash_table),
      cmocka_unit_test(dp_matches_brute_force),
      cmocka_unit_test(memory_cap_rejection),
      cmocka_unit_test(slow_link_moves_the_cut),
      cmocka_unit_test(uniform_splits),
      cmocka_unit_test(resnet20_balanced),
      cmocka_unit_test(bert_layer_boundaries),
  };
  return AX_TEST_MAIN(t);
}
