/* Collectives between N nodes of one process (N = 1..4), in both orders
 * (ring and tree): the all-reduce against a direct sum for sizes not
 * divisible by N (and one above the 1 MiB bulk threshold), averaging, the
 * bucketed all-reduce, broadcast, and neighbour exchange; the tree
 * all-reduce of values whose sum depends on its order equal, bit for bit,
 * to the sum tree of kernels/sum_tree.h over the members (and, from 3
 * members, not to the ring's); the same with 4 ranks on 2 nodes. Every
 * node ends with zero live calls and futures. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/collective.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define MAXN 4
static const size_t g_sizes[] = {1, 7, 1001, 65537, 300007};
#define NSIZES (sizeof g_sizes / sizeof g_sizes[0])

typedef struct member {
  int N, r;
  ax_node *node;
  int rc;
  char why[256];
  /* A node shared by several ranks (test_shared): the group's names, the
   * node joined already; NULL: c0 .. c3, one rank per node, joined here. */
  const char *const *names;
} member;

/* Value of element i on member r: exact in f32 so the sum is exact. */
static float val(int r, size_t i) {
  return (float)((int)((i * 7 + r * 13) % 101) - 50) / 4.0f;
}

static int mfail(member *m, int rc, const char *what) {
  m->rc = rc;
  snprintf(m->why, sizeof m->why, "%s: %s", what, ax_errmsg());
  return rc;
}

static ax_tensor *vec_new(size_t n) {
  int64_t s = (int64_t)n;
  return ax_tensor_new(AX_F32, 1, &s, AX_CPU);
}

static ax_tensor *filled(int r, size_t n) {
  ax_tensor *t = vec_new(n);
  for (size_t i = 0; i < n; i++)
    ax_f32(t)[i] = val(r, i);
  return t;
}

/* Inexact values of mixed magnitudes: the order of their sum shows in
 * its bits. */
static float wild(int r, size_t i) {
  double x = 1.0 / (3.0 + (double)((i * 31 + (size_t)r * 17) % 997));
  return (float)(r % 2 ? x * 1e3 : -x * 1e-2);
}

static int vec_add(void *u, void *acc, void *x) {
  size_t n = *(size_t *)u;
  for (size_t i = 0; i < n; i++)
    ((float *)acc)[i] += ((const float *)x)[i];
  return AX_OK;
}
static void vec_drop(void *u, void *x) {
  (void)u;
  free(x);
}

/* The tree all-reduce of wild values against the sum tree over the
 * members (SUM) and against the ring's all-reduce (from 3 members, the
 * orders differ: some element must too). */
static void check_tree_bits(member *m, ax_coll_group *g, ax_coll_group *ring) {
  size_t n = 65537;
  ax_sum_tree st;
  ax_sum_tree_init(&st, AX_SUM_TREE, vec_add, vec_drop, &n);
  for (int r = 0; r < m->N; r++) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      v[i] = wild(r, i);
    ax_sum_tree_push(&st, v);
  }
  void *want = NULL;
  ax_sum_tree_finish(&st, &want);
  ax_tensor *t = vec_new(n), *u = vec_new(n);
  for (size_t i = 0; i < n; i++)
    ax_f32(t)[i] = ax_f32(u)[i] = wild(m->r, i);
  int rc = ax_coll_allreduce(g, t, AX_COLL_SUM);
  if (rc == AX_OK)
    rc = ax_coll_allreduce(ring, u, AX_COLL_SUM);
  if (rc != AX_OK)
    mfail(m, rc, "wild all-reduce");
  else if (memcmp(ax_f32(t), want, n * sizeof(float)))
    mfail(m, AX_EINTERNAL, "tree all-reduce bits != the sum tree's");
  else if (m->N >= 3 && !memcmp(ax_f32(t), ax_f32(u), n * sizeof(float)))
    mfail(m, AX_EINTERNAL, "tree and ring sums equal: the test sees no order");
  free(want);
  ax_tensor_release(t);
  ax_tensor_release(u);
}

static void run_checks(member *m, ax_coll_group *g) {
  int rc;
  for (size_t k = 0; k < NSIZES && m->rc == AX_OK; k++) {
    size_t n = g_sizes[k];
    for (int avg = 0; avg < 2 && m->rc == AX_OK; avg++) {
      ax_tensor *t = filled(m->r, n);
      rc = ax_coll_allreduce(g, t, avg ? AX_COLL_AVG : AX_COLL_SUM);
      if (rc != AX_OK)
        mfail(m, rc, "allreduce");
      for (size_t i = 0; i < n && m->rc == AX_OK; i++) {
        float want = 0;
        for (int r = 0; r < m->N; r++)
          want += val(r, i);
        if (avg)
          want /= (float)m->N;
        if (fabsf(ax_f32(t)[i] - want) > 1e-5f * (1 + fabsf(want))) {
          m->rc = AX_EINTERNAL;
          snprintf(m->why, sizeof m->why, "n=%zu avg=%d i=%zu: %g != %g", n,
                   avg, i, ax_f32(t)[i], want);
        }
      }
      ax_tensor_release(t);
    }
  }
  /* The all-reduce's halves (ZeRO): after reduce-scatter this member's
   * shard (1/N of the elements, rounded) holds the all-reduce's very bits;
   * after all-gather every element does. */
  for (size_t k = 0; k < NSIZES && m->rc == AX_OK; k++) {
    size_t n = g_sizes[k], off = 0, len = 0;
    ax_tensor *t = filled(m->r, n), *want = filled(m->r, n);
    if ((rc = ax_coll_allreduce(g, want, AX_COLL_AVG)) != AX_OK ||
        (rc = ax_coll_reduce_scatter(g, t, AX_COLL_AVG)) != AX_OK)
      mfail(m, rc, "reduce-scatter");
    ax_coll_shard(g, n, &off, &len);
    size_t N = (size_t)m->N;
    if (m->rc == AX_OK &&
        (off + len > n || len < n / N || len > (n + N - 1) / N))
      mfail(m, AX_EINTERNAL, "shard range");
    if (m->rc == AX_OK &&
        memcmp(ax_f32(t) + off, ax_f32(want) + off, len * sizeof(float)))
      mfail(m, AX_EINTERNAL, "reduce-scatter bits");
    if (m->rc == AX_OK && (rc = ax_coll_allgather(g, t)) != AX_OK)
      mfail(m, rc, "all-gather");
    if (m->rc == AX_OK && memcmp(ax_f32(t), ax_f32(want), n * sizeof(float)))
      mfail(m, AX_EINTERNAL, "all-gather bits");
    ax_tensor_release(t);
    ax_tensor_release(want);
  }
  /* Buckets: ranges reported from the top down, as a backward does. */
  size_t n = 100003;
  ax_tensor *t = filled(m->r, n);
  ax_coll_buckets *b;
  if (m->rc == AX_OK &&
      (rc = ax_coll_buckets_begin(g, t, 40000, AX_COLL_SUM, &b)) == AX_OK) {
    size_t hi = n;
    while (hi > 20000) {
      ax_coll_buckets_ready(b, hi - 7000, 7000);
      hi -= 7000;
    } /* [0, hi) is left for _end */
    if ((rc = ax_coll_buckets_end(b, 0)) != AX_OK)
      mfail(m, rc, "buckets");
    for (size_t i = 0; i < n && m->rc == AX_OK; i++) {
      float want = 0;
      for (int r = 0; r < m->N; r++)
        want += val(r, i);
      if (ax_f32(t)[i] != want)
        mfail(m, AX_EINTERNAL, "bucket sum");
    }
  }
  ax_tensor_release(t);
  /* Broadcast from the last member, then neighbours. */
  t = filled(m->r, 5000);
  if (m->rc == AX_OK && (rc = ax_coll_broadcast(g, t, m->N - 1)) != AX_OK)
    mfail(m, rc, "broadcast");
  for (size_t i = 0; i < 5000 && m->rc == AX_OK; i++)
    if (ax_f32(t)[i] != val(m->N - 1, i))
      mfail(m, AX_EINTERNAL, "broadcast value");
  ax_tensor_release(t);
  t = filled(m->r, 333);
  ax_tensor *a = ax_tensor_like(t), *c = ax_tensor_like(t);
  ax_coll_op *op;
  if (m->rc == AX_OK &&
      ((rc = ax_coll_neighbors_async(g, t, a, c, &op)) != AX_OK ||
       (rc = ax_coll_wait(op, 0)) != AX_OK))
    mfail(m, rc, "neighbors");
  int prev = (m->r + m->N - 1) % m->N, next = (m->r + 1) % m->N;
  for (size_t i = 0; i < 333 && m->rc == AX_OK; i++)
    if (ax_f32(a)[i] != val(prev, i) || ax_f32(c)[i] != val(next, i))
      mfail(m, AX_EINTERNAL, "neighbor values");
  ax_tensor_release(t);
  ax_tensor_release(a);
  ax_tensor_release(c);
}

static void *member_main(void *p) {
  member *m = p;
  static const char *const one[MAXN] = {"c0", "c1", "c2", "c3"};
  const char *const *names = m->names ? m->names : one;
  if (!m->names && (m->rc = ax_node_join(m->node, 30000)) != AX_OK)
    return (void *)(intptr_t)mfail(m, m->rc, "join");
  ax_coll_group *g[AX_SUM_ORDERS] = {NULL};
  for (int o = 0; o < AX_SUM_ORDERS && m->rc == AX_OK; o++) {
    const char *tag = ax_sum_order_name(o);
    int rc = m->names
                 ? ax_coll_group_new_rank(m->node, tag, m->N, names, m->r,
                                          20000, &g[o])
                 : ax_coll_group_new(m->node, tag, m->N, names, 20000, &g[o]);
    if (rc != AX_OK) {
      mfail(m, rc, "group");
      break;
    }
    ax_coll_group_set_order(g[o], (ax_sum_order)o);
    run_checks(m, g[o]);
  }
  if (m->rc == AX_OK)
    check_tree_bits(m, g[AX_SUM_TREE], g[AX_SUM_CHAIN]);
  for (int o = 0; o < AX_SUM_ORDERS; o++)
    ax_coll_group_free(g[o]);
  return NULL;
}

static void run_world(int N) {
  int port = rt_free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  member m[MAXN] = {0};
  pthread_t th[MAXN];
  for (int r = 0; r < N; r++) {
    char name[8];
    snprintf(name, sizeof name, "c%d", r);
    ax_node_opts o;
    ax_node_opts_init(&o);
    o.name = name;
    o.listen = r ? "127.0.0.1:0" : listen;
    o.master = r ? listen : NULL;
    o.world_size = r ? 0 : N;
    o.rank = r;
    o.threads = 2;
    m[r].N = N;
    m[r].r = r;
    AX_ASSERT_OK(ax_node_create(&o, &m[r].node));
    AX_ASSERT_OK(ax_coll_init(m[r].node));
  }
  for (int r = 0; r < N; r++)
    pthread_create(&th[r], NULL, member_main, &m[r]);
  for (int r = 0; r < N; r++)
    pthread_join(th[r], NULL);
  for (int r = 0; r < N; r++)
    if (m[r].rc != AX_OK)
      fail_msg("N=%d member %d: %s (%s)", N, r, ax_errname(m[r].rc), m[r].why);
  AX_ASSERT_OK(rt_local_zero());
  for (int r = 0; r < N; r++) {
    ax_node_shutdown(m[r].node, 2000);
    ax_coll_fini(m[r].node);
    ax_node_destroy(m[r].node);
  }
}

/* N nodes of one world (names[0] the master), joined; and their end. */
static void *join_main(void *n) {
  return (void *)(intptr_t)ax_node_join(n, 30000);
}

static void start_nodes(int N, const char *const *names, ax_node **n) {
  int port = rt_free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  pthread_t jt[MAXN];
  for (int r = 0; r < N; r++) {
    ax_node_opts o;
    ax_node_opts_init(&o);
    o.name = names[r];
    o.listen = r ? "127.0.0.1:0" : listen;
    o.master = r ? listen : NULL;
    o.world_size = r ? 0 : N;
    o.rank = r;
    o.threads = 2;
    AX_ASSERT_OK(ax_node_create(&o, &n[r]));
    AX_ASSERT_OK(ax_coll_init(n[r]));
  }
  for (int r = 1; r < N; r++)
    pthread_create(&jt[r], NULL, join_main, n[r]);
  AX_ASSERT_OK(ax_node_join(n[0], 30000));
  for (int r = 1; r < N; r++)
    pthread_join(jt[r], NULL);
}

static void end_nodes(int N, ax_node **n) {
  for (int r = 0; r < N; r++) {
    ax_node_shutdown(n[r], 2000);
    ax_coll_fini(n[r]);
    ax_node_destroy(n[r]);
  }
}

/* ax_coll_group_abort: member c0 waits in an all-reduce that c1 never
 * joins (c1 is up, so no liveness check ends the wait); the abort from
 * another thread ends it at once with AX_ECANCELLED and the reason, and
 * the group fails its next operation the same way. */
typedef struct abort_arg { /* one member's wait in an all-reduce */
  ax_coll_group *g;
  int rc;
  char why[256];
  int64_t done_ms;
} abort_arg;

static void *abort_waiter(void *p) {
  abort_arg *a = p;
  ax_tensor *t = filled(0, 1001);
  a->rc = ax_coll_allreduce(a->g, t, AX_COLL_SUM);
  snprintf(a->why, sizeof a->why, "%s", ax_errmsg());
  a->done_ms = ax_clock_ms();
  ax_tensor_release(t);
  return NULL;
}

static void test_abort(void **s) {
  const char *names[2] = {"c0", "c1"};
  ax_node *n[2];
  start_nodes(2, names, n);
  pthread_t th;
  abort_arg a = {0};
  ax_coll_group *g1 = NULL;
  AX_ASSERT_OK(ax_coll_group_new(n[0], "ab", 2, names, 20000, &a.g));
  AX_ASSERT_OK(ax_coll_group_new(n[1], "ab", 2, names, 20000, &g1));
  pthread_create(&th, NULL, abort_waiter, &a);
  rt_sleep_ms(300);
  int64_t t0 = ax_clock_ms();
  ax_coll_group_abort(a.g, "the test ends it");
  pthread_join(th, NULL);
  fprintf(stderr, "  abort ended the wait after %lld ms: %s\n",
          (long long)(a.done_ms - t0), a.why);
  assert_int_equal(a.rc, AX_ECANCELLED);
  assert_non_null(strstr(a.why, "the test ends it"));
  assert_true(a.done_ms - t0 < 1000);
  ax_tensor *t = filled(0, 7);
  assert_int_equal(ax_coll_allreduce(a.g, t, AX_COLL_SUM), AX_ECANCELLED);
  ax_tensor_release(t);
  ax_coll_group_free(a.g);
  ax_coll_group_free(g1);
  rt_sleep_ms(100); /* the abort notice's answer */
  AX_ASSERT_OK(rt_local_zero());
  end_nodes(2, n);
}

/* A member whose group ends (its owner aborts it, or one of its
 * operations fails) tells the others: c0 and c1 wait in an all-reduce that
 * c2 never joins (c2 is up); c2's abort ends their waits at once with
 * AX_ECANCELLED naming c2, not after their timeout. */
static void test_remote_abort(void **s) {
  const char *names[3] = {"c0", "c1", "c2"};
  ax_node *n[3];
  start_nodes(3, names, n);
  abort_arg a[2];
  pthread_t th[2];
  ax_coll_group *g2 = NULL;
  for (int r = 0; r < 2; r++) {
    a[r] = (abort_arg){NULL, 0, "", 0};
    AX_ASSERT_OK(ax_coll_group_new(n[r], "ra", 3, names, 20000, &a[r].g));
  }
  AX_ASSERT_OK(ax_coll_group_new(n[2], "ra", 3, names, 20000, &g2));
  for (int r = 0; r < 2; r++)
    pthread_create(&th[r], NULL, abort_waiter, &a[r]);
  rt_sleep_ms(300);
  int64_t t0 = ax_clock_ms();
  ax_coll_group_abort(g2, "c2 gives up");
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
    fprintf(stderr, "  c%d: ended %lld ms after c2's abort: %s\n", r,
            (long long)(a[r].done_ms - t0), a[r].why);
    assert_int_equal(a[r].rc, AX_ECANCELLED);
    assert_non_null(strstr(a[r].why, "c2"));
    assert_true(a[r].done_ms - t0 < 2000);
  }
  for (int r = 0; r < 2; r++)
    ax_coll_group_free(a[r].g);
  ax_coll_group_free(g2);
  rt_sleep_ms(100); /* the notices' answers */
  AX_ASSERT_OK(rt_local_zero());
  end_nodes(3, n);
}

/* Ranks that share a node (ax_coll_group_new_rank): 4 ranks on 2 nodes,
 * c0 playing ranks 0 and 2 and c1 ranks 1 and 3, each rank on its own
 * thread with its own group object, pass every check of the 4-node world;
 * a repeated name without a rank, or a rank that is not this node's, is
 * refused. */
static void test_shared(void **s) {
  static const char *const names[MAXN] = {"c0", "c1", "c0", "c1"};
  ax_node *n[2];
  start_nodes(2, names, n);
  ax_coll_group *g = NULL;
  assert_int_equal(ax_coll_group_new(n[0], "x", 4, names, 1000, &g), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "holds 2 ranks"));
  assert_int_equal(ax_coll_group_new_rank(n[0], "x", 4, names, 1, 1000, &g),
                   AX_EINVAL);
  assert_null(g);
  member m[MAXN] = {0};
  pthread_t th[MAXN];
  for (int r = 0; r < MAXN; r++) {
    m[r] = (member){MAXN, r, n[r % 2], AX_OK, "", names};
    pthread_create(&th[r], NULL, member_main, &m[r]);
  }
  for (int r = 0; r < MAXN; r++)
    pthread_join(th[r], NULL);
  for (int r = 0; r < MAXN; r++)
    if (m[r].rc != AX_OK)
      fail_msg("shared, rank %d: %s (%s)", r, ax_errname(m[r].rc), m[r].why);
  rt_sleep_ms(100); /* the last sends' answers */
  AX_ASSERT_OK(rt_local_zero());
  end_nodes(2, n);
}

static void test_n1(void **s) { run_world(1); }
static void test_n2(void **s) { run_world(2); }
static void test_n3(void **s) { run_world(3); }
static void test_n4(void **s) { run_world(4); }

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_n1),    cmocka_unit_test(test_n2),
      cmocka_unit_test(test_n3),    cmocka_unit_test(test_n4),
      cmocka_unit_test(test_abort), cmocka_unit_test(test_remote_abort),
      cmocka_unit_test(test_shared)};
  return AX_TEST_MAIN(t);
}
