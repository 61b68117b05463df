/* The typed stage messages (runtime/pipeline/stage/stage_msg-impl.h): every
 * message round-trips (encode, decode: the same fields; encode again: the
 * same list), and every decoder refuses a short list, a long list, a value
 * of the wrong kind, a number out of its range and a bad optional part's
 * name with AX_EBADARG and a message naming the message. In process: one node
 * of a world of one, for the RRefs some messages carry. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "harness.h"
#include "tests/mp_testutil.h"
#include "tests/stage_msg_samples.h"

static ax_node *g_node;
static ax_rref *g_rref;
static ax_tensor *g_t[3];

/* The same values: numbers bit for bit, strings and bytes by content,
 * tensors and RRefs by identity (the lists share them). */
static int same_list(const ax_values *a, const ax_values *b) {
  size_t n = ax_values_count(a);
  if (n != ax_values_count(b))
    return 0;
  for (size_t i = 0; i < n; i++) {
    ax_value_type t = ax_values_type(a, i);
    int64_t x, y;
    double d, e;
    const char *s, *u;
    const void *p, *q;
    size_t k, l;
    ax_tensor *ta, *tb;
    void *oa, *ob;
    if (t != ax_values_type(b, i))
      return 0;
    if (t == AX_VAL_I64 &&
        (ax_values_get_i64(a, i, &x) || ax_values_get_i64(b, i, &y) || x != y))
      return 0;
    if (t == AX_VAL_F64 &&
        (ax_values_get_f64(a, i, &d) || ax_values_get_f64(b, i, &e) ||
         memcmp(&d, &e, sizeof d)))
      return 0;
    if (t == AX_VAL_STR && (ax_values_get_str(a, i, &s) ||
                            ax_values_get_str(b, i, &u) || strcmp(s, u)))
      return 0;
    if (t == AX_VAL_BYTES &&
        (ax_values_get_bytes(a, i, &p, &k) ||
         ax_values_get_bytes(b, i, &q, &l) || k != l || (k && memcmp(p, q, k))))
      return 0;
    if (t == AX_VAL_TENSOR && (ax_values_get_tensor(a, i, &ta) ||
                               ax_values_get_tensor(b, i, &tb) || ta != tb))
      return 0;
    if (t == AX_VAL_EXT &&
        (ax_values_get_ext(a, i, AX_VALUE_EXT_RREF, &oa) ||
         ax_values_get_ext(b, i, AX_VALUE_EXT_RREF, &ob) || oa != ob))
      return 0;
  }
  return 1;
}

static ax_values *encoded(int id, const void *m) {
  ax_values *v = ax_values_new();
  assert_non_null(v);
  AX_ASSERT_OK(axi_pipe_msg_encode(id, m, v));
  return v;
}

/* Decoding v must fail with AX_EBADARG, naming the message. */
static void refused(int id, const ax_values *v, const char *what) {
  sm_any d;
  int err = axi_pipe_msg_decode(id, v, &d);
  if (err != AX_EBADARG)
    fail_msg("%s: %s: %s, expected AX_EBADARG", axi_pipe_msg_name(id), what,
             ax_errname(err));
  assert_non_null(strstr(ax_errmsg(), axi_pipe_msg_name(id)));
}

/* Decoding v either fails with AX_EBADARG or gives a struct that encodes
 * to v again; returns 1 for a refusal. */
static int refused_or_same(int id, const ax_values *v) {
  sm_any d;
  int err = axi_pipe_msg_decode(id, v, &d);
  if (err != AX_OK) {
    AX_ASSERT_ERR(err, AX_EBADARG);
    return 1;
  }
  ax_values *w = encoded(id, &d);
  assert_true(same_list(v, w));
  ax_values_free(w);
  return 0;
}

/* v with its value i replaced by x (an i64) or by the string s. */
static ax_values *replaced(const ax_values *v, size_t i, const char *s,
                           int64_t x) {
  ax_values *w = ax_values_new();
  ax_values_view a, b;
  AX_ASSERT_OK(ax_values_append(w, ax_values_view_range(v, 0, i, &a)));
  AX_ASSERT_OK(s ? ax_values_add_str(w, s) : ax_values_add_i64(w, x));
  AX_ASSERT_OK(ax_values_append(
      w, ax_values_view_range(v, i + 1, ax_values_count(v), &b)));
  return w;
}

static void test_round_trip(void **state) {
  for (int id = 0; id < axi_pipe_msg_count(); id++)
    for (int full = 0; full < 2; full++) {
      sm_any m, d;
      sm_sample(id, &m, full, g_t, g_rref);
      ax_values *v = encoded(id, &m);
      AX_ASSERT_OK(axi_pipe_msg_decode(id, v, &d));
      ax_values *w = encoded(id, &d);
      if (!same_list(v, w))
        fail_msg("%s does not encode its decoding again",
                 axi_pipe_msg_name(id));
      ax_values_free(w);
      ax_values_free(v);
    }
}

/* The decoded fields themselves, message by message. */
static void test_decoded_fields(void **state) {
  ax_values *v = ax_values_new();
  axi_pipe_fwd_msg f, fd;
  assert_true(sm_is(1, "axon.pipe.stage fwd")); /* before it is written */
  sm_sample(1, &f, 1, g_t, g_rref);
  AX_ASSERT_OK(axi_pipe_fwd_encode(&f, v));
  /* batch, micro, seed, flags, n_in, the input; "labels", n_lab, two
   * labels, two norms; "scale", the scale */
  assert_int_equal(ax_values_count(v), 5 + 1 + 1 + 1 + 2 + 2 + 1 + 1);
  AX_ASSERT_OK(axi_pipe_fwd_decode(v, &fd));
  assert_true(fd.batch == 5 && fd.micro == 3 && fd.seed == -9 &&
              fd.flags == 3 && fd.has_labels);
  assert_true(fd.in.n == 1 && fd.in.t[0] == g_t[0]);
  assert_true(fd.lab.t.n == 2 && fd.lab.t.t[1] == g_t[2]);
  assert_true(fd.lab.norm[0] == 4 && fd.lab.norm[1] == 0);
  assert_true(fd.has_scale && fd.scale == 0.75);
  ax_values_truncate(v, 0);
  axi_pipe_setup_msg s, sd;
  assert_true(sm_is(0, "axon.pipe.stage setup"));
  sm_sample(0, &s, 1, g_t, g_rref);
  AX_ASSERT_OK(axi_pipe_setup_encode(&s, v));
  AX_ASSERT_OK(axi_pipe_setup_decode(v, &sd));
  assert_true(sd.prev == g_rref && !sd.next && sd.self_id == 77);
  assert_true(sd.has_stale && sd.gamma == 0.5 && sd.has_tp && sd.zero == 1);
  assert_string_equal(sd.optim, "opt=sgd,lr=0.1");
  assert_string_equal(sd.replicas.names[1], "b");
  assert_true(sd.replicas.rank == 1 && sd.tp.rank == 2);
  assert_string_equal(sd.tp.tag, "tp1");
  assert_string_equal(sd.tp.names[2], "e");
  assert_true(sd.has_precision && sd.precision == 1);
  assert_true(sd.has_ties && sd.ties.n == 2 && sd.ties.t[1].tie == 3);
  assert_true(sd.ties.t[0].g.rank == 1 && sd.ties.t[1].g.rank == 0);
  assert_string_equal(sd.ties.t[0].g.names[1], "c");
  assert_string_equal(sd.ties.t[1].g.tag, "ti2");
  ax_values_truncate(v, 0);
  axi_pipe_report_msg r = {1, 5, 2, 3, 4, 0}, rd;
  AX_ASSERT_OK(axi_pipe_report_encode(&r, v));
  AX_ASSERT_OK(axi_pipe_report_decode(v, &rd));
  assert_true(!rd.has_loss && rd.state_bytes == 4 && rd.loss == 0);
  assert_true(rd.busy_us == 1 && rd.cpu_us == 5);
  ax_values_truncate(v, 0);
  AX_ASSERT_OK(axi_pipe_mem_forget_encode(v));
  AX_ASSERT_OK(axi_pipe_mem_forget_decode(v));
  AX_ASSERT_OK(ax_values_add_i64(v, 0));
  AX_ASSERT_ERR(axi_pipe_mem_forget_decode(v), AX_EBADARG);
  ax_values_free(v);
}

/* Every prefix of the full message is refused, or is the message with
 * its later optional parts absent; every prefix of the minimal one is
 * refused; one value more is refused. */
static void test_short_and_long(void **state) {
  for (int id = 0; id < axi_pipe_msg_count(); id++)
    for (int full = 0; full < 2; full++) {
      sm_any m;
      sm_sample(id, &m, full, g_t, g_rref);
      ax_values *v = encoded(id, &m);
      size_t n = ax_values_count(v);
      for (size_t k = 0; k < n; k++) {
        ax_values_view view;
        const ax_values *p = ax_values_view_range(v, 0, k, &view);
        if (full)
          refused_or_same(id, p);
        else
          refused(id, p, "a short list");
      }
      AX_ASSERT_OK(ax_values_add_str(v, "more"));
      refused(id, v, "a long list");
      ax_values_free(v);
    }
}

/* A string where anything else is, a number where a string is. */
static void test_wrong_kind(void **state) {
  for (int id = 0; id < axi_pipe_msg_count(); id++) {
    sm_any m;
    sm_sample(id, &m, 1, g_t, g_rref);
    ax_values *v = encoded(id, &m);
    for (size_t i = 0; i < ax_values_count(v); i++) {
      int str = ax_values_type(v, i) == AX_VAL_STR;
      ax_values *w = replaced(v, i, str ? NULL : "x", 1);
      refused(id, w, "a value of the wrong kind");
      ax_values_free(w);
    }
    ax_values_free(v);
  }
}

/* Extreme numbers in every i64 position: refused, or in range (the
 * decoding encodes to the same list); the messages with ranged fields
 * refuse some. A checksum of the wrong length is refused (but by
 * ckpt_load, which takes "" for a file the manifest lacks). */
static void test_out_of_range(void **state) {
  const int64_t extreme[] = {INT64_MIN,        -2,       -1, 2, 5,
                             (int64_t)1 << 40, INT64_MAX};
  for (int id = 0; id < axi_pipe_msg_count(); id++) {
    sm_any m;
    sm_sample(id, &m, 1, g_t, g_rref);
    ax_values *v = encoded(id, &m);
    int refusals = 0, ranged = 0;
    for (size_t i = 0; i < ax_values_count(v); i++) {
      if (ax_values_type(v, i) != AX_VAL_I64)
        continue;
      ranged = 1;
      for (size_t j = 0; j < sizeof extreme / sizeof extreme[0]; j++) {
        ax_values *w = replaced(v, i, NULL, extreme[j]);
        refusals += refused_or_same(id, w);
        ax_values_free(w);
      }
    }
    if (ranged && !refusals)
      fail_msg("%s refuses no number", axi_pipe_msg_name(id));
    for (size_t i = 0; i < ax_values_count(v); i++) {
      const char *s;
      if (ax_values_type(v, i) == AX_VAL_STR &&
          ax_values_get_str(v, i, &s) == AX_OK && !strcmp(s, SM_SHA) &&
          !sm_is(id, "axon.pipe.stage ckpt_load")) {
        ax_values *w = replaced(v, i, "abc", 0);
        refused(id, w, "a short checksum");
        ax_values_free(w);
      }
    }
    ax_values_free(v);
  }
}

/* Encoders refuse what a decoder would: here, too many inputs, a step
 * of 2 and a group's rank outside its members. */
static void test_encoder_refuses(void **state) {
  ax_values *v = ax_values_new();
  axi_pipe_fwd_msg f;
  sm_sample(1, &f, 0, g_t, g_rref);
  f.in.n = AX_TLIST_MAX + 1;
  AX_ASSERT_ERR(axi_pipe_fwd_encode(&f, v), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "inputs"));
  axi_pipe_bwd_msg b = {1, 0, 2, 1};
  AX_ASSERT_ERR(axi_pipe_bwd_encode(&b, v), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "step"));
  axi_pipe_setup_msg s;
  sm_sample(0, &s, 1, g_t, g_rref);
  s.tp.rank = 3; /* a rank outside the group's 3 members */
  AX_ASSERT_ERR(axi_pipe_setup_encode(&s, v), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "tensor-parallel members"));
  ax_values_free(v);
}

/* The optional parts are named: any of them may be absent, whatever
 * comes after it; a decoder refuses an unknown name, a repeated one, one
 * out of order, a part of the wrong kind and a value that is no name where
 * a part starts, naming the message and what is wrong. */
static void test_named_parts(void **state) {
  axi_pipe_setup_msg s, sd;
  sm_sample(0, &s, 1, g_t, g_rref);
  s.has_stale = s.has_replicas = s.has_zero = s.has_tp = 0; /* the last two */
  ax_values *v = encoded(0, &s);
  /* the 7 fixed values; "precision", 1; "ties", 2, 2 x (tie, 2, rank, tag,
   * 2 names) */
  assert_int_equal(ax_values_count(v), 7 + 2 + 2 + 2 * 6);
  AX_ASSERT_OK(axi_pipe_setup_decode(v, &sd));
  assert_true(!sd.has_stale && !sd.has_replicas && !sd.has_zero && !sd.has_tp);
  assert_true(sd.has_precision && sd.precision == 1);
  assert_true(sd.has_ties && sd.ties.n == 2 && sd.ties.t[1].tie == 3);
  ax_values_free(v);
  s.has_ties = 0; /* the precision alone: its name at value 7 */
  v = encoded(0, &s);
  assert_int_equal(ax_values_count(v), 9);
  ax_values *w = replaced(v, 7, "bogus", 0);
  refused(0, w, "an unknown part");
  assert_non_null(strstr(ax_errmsg(), "unknown optional part 'bogus'"));
  ax_values_free(w);
  w = replaced(v, 7, NULL, 5);
  refused(0, w, "a number where a part's name is");
  assert_non_null(strstr(ax_errmsg(), "expected the name of an optional"));
  ax_values_free(w);
  w = replaced(v, 8, "fp32", 0);
  refused(0, w, "a part of the wrong kind");
  assert_non_null(strstr(ax_errmsg(), "precision (value 8): str"));
  ax_values_free(w);
  AX_ASSERT_OK(ax_values_add_str(v, "precision"));
  AX_ASSERT_OK(ax_values_add_i64(v, 1));
  refused(0, v, "a repeated part");
  assert_non_null(strstr(ax_errmsg(), "precision (value 9): the optional "
                                      "part is repeated"));
  ax_values_truncate(v, 7);
  AX_ASSERT_OK(ax_values_add_str(v, "precision"));
  AX_ASSERT_OK(ax_values_add_i64(v, 1));
  AX_ASSERT_OK(ax_values_add_str(v, "zero"));
  AX_ASSERT_OK(ax_values_add_i64(v, 0));
  refused(0, v, "a part out of order");
  assert_non_null(strstr(ax_errmsg(), "zero (value 9): out of order: it "
                                      "comes before precision"));
  ax_values_free(v);
  /* a message without optional parts refuses a name as one value more */
  axi_pipe_step_msg st = {6, 4};
  assert_true(sm_is(5, "axon.pipe.stage step"));
  v = encoded(5, &st);
  AX_ASSERT_OK(ax_values_add_str(v, "precision"));
  refused(5, v, "a part of a message without parts");
  assert_non_null(strstr(ax_errmsg(), "more than it holds"));
  ax_values_free(v);
}

static int setup_node(void **state) {
  char name[] = "stagemsg";
  if (dt_driver(name, rt_free_port(), 1, &g_node) != AX_OK)
    return -1;
  ax_call_opts co = {.timeout_ms = 10000};
  if (ax_remote_object(g_node, name, "axon.pipe.optim", "", AX_CPU, &co,
                       &g_rref) != AX_OK)
    return -1;
  for (int i = 0; i < 3; i++)
    g_t[i] = ax_test_randn((uint64_t)i, 1.0f, 1, (int64_t[]){i + 2});
  return 0;
}

static int teardown_node(void **state) {
  for (int i = 0; i < 3; i++)
    ax_tensor_release(g_t[i]);
  ax_rref_release(g_rref);
  dt_driver_end(g_node);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_decoded_fields),
      cmocka_unit_test(test_short_and_long),
      cmocka_unit_test(test_wrong_kind),
      cmocka_unit_test(test_out_of_range),
      cmocka_unit_test(test_encoder_refuses),
      cmocka_unit_test(test_named_parts),
  };
  if (setup_node(NULL) != 0)
    return 1;
  int rc = AX_TEST_MAIN(tests);
  teardown_node(NULL);
  return rc;
}
