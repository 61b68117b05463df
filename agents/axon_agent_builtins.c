/* Built-in functions of axon-agent, in the reserved namespace (rpc/
 * builtin-impl.h). The agent's own, for `axon-run probe`:
 *   axon.agent.sink(...)      -> i64 tensor bytes received (other values
 *                                are ignored; nothing else done)
 *   axon.agent.probe(str peer, i64 iters, i64 bytes) -> (f64 median round
 *                                trip of a small call to peer's sink in
 *                                microseconds, f64 Gbit/s: `bytes` over
 *                                the best of 3 sends of a tensor that size
 *                                to peer's sink, less the small call's
 *                                round trip)
 * The test functions, used by the multi-process tests and the benchmark:
 *   axon.test.echo(...)       -> the same values, every type
 *   axon.test.add(i64 a, i64 b) -> a + b (AX_EBADARG on other types)
 *   axon.test.sleep_ms(i64 ms) -> ms, after sleeping (at most 60 s)
 *   axon.test.chain(i64 depth, str nodes) -> depth: forwards chain(depth -
 *                                1) to the next name in the comma-separated
 *                                list (round robin after the caller's own
 *                                name), deferring instead of blocking a
 *                                worker
 *   axon.test.checksum(tensor) -> (i64 checksum of its bytes, i64 nbytes)
 *   axon.test.make_tensor(i64 n, i64 seed) -> f32 tensor (n,) with values
 *                                seed + i
 *   axon.test.device_of(tensor...) -> str per tensor: the device it landed
 *                                on here ("cpu", "cuda:0"; --device-map
 *                                tests)
 *   axon.test.fail(i64 code, str msg) -> the error code with that message
 *   axon.test.push(str to, i64 key, i64 delay_ms, tensor or i64 0 ...) ->
 *                                nothing: after delay_ms (at most 60 s)
 *                                pushes the tensors (i64 0: no tensor) to
 *                                node `to` under the call's autograd
 *                                context for consumer `key`
 *                                (ax_dist_push), answering once `to`
 *                                stored them or failed */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/builtin-impl.h"
#include "axon/rpc/value.h"
#include "axon/runtime/autograd/autograd.h"

#include "agents/axon_agent.h"

static int echo(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                void *user) {
  for (size_t i = 0; i < ax_values_count(args); i++)
    if (ax_values_type(args, i) == AX_VAL_EXT) /* RRefs are not echoed */
      return ax_seterr(AX_EBADARG, "echo: value %zu has an unsupported type",
                       i);
  return ax_values_append(out, args);
}

static int add(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
               void *user) {
  int64_t a, b;
  AX_TRY(ax_values_get_i64(args, 0, &a));
  AX_TRY(ax_values_get_i64(args, 1, &b));
  return ax_values_add_i64(out, a + b);
}

static int sleep_ms(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  int64_t ms;
  AX_TRY(ax_values_get_i64(args, 0, &ms));
  if (ms < 0 || ms > 60000)
    return ax_seterr(AX_EINVAL, "sleep_ms: %lld out of [0, 60000]",
                     (long long)ms);
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  return ax_values_add_i64(out, ms);
}

static int push(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                void *user) {
  const char *to;
  int64_t key, ms;
  AX_TRY(ax_values_get_str(args, 0, &to));
  AX_TRY(ax_values_get_i64(args, 1, &key));
  AX_TRY(ax_values_get_i64(args, 2, &ms));
  size_t n = ax_values_count(args);
  if (ms < 0 || ms > 60000 || n - 3 > AX_TLIST_MAX)
    return ax_seterr(AX_EINVAL, "push: delay %lld ms, %zu tensors",
                     (long long)ms, n - 3);
  ax_tlist t = {0}; /* borrowed from args */
  for (size_t i = 3; i < n; i++) {
    t.t[t.n] = NULL;
    if (ax_values_type(args, i) == AX_VAL_TENSOR)
      AX_TRY(ax_values_get_tensor(args, i, &t.t[t.n]));
    t.n++;
  }
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  ax_future *f = NULL;
  AX_TRY(ax_dist_push(ax_call_node(ctx), ax_call_autograd_ctx(ctx), to,
                      (uint64_t)key, &t, &f));
  int err = ax_call_defer(ctx, f);
  ax_future_release(f);
  return err;
}

/* Completes the promise with the nested depth + 1. */
static void chain_done(ax_future *nested, void *user) {
  ax_future *p = user;
  int64_t d = -1;
  int err = ax_future_err(nested);
  if (err == AX_OK &&
      ax_values_get_i64(ax_future_values(nested), 0, &d) != AX_OK)
    err = AX_EMALFORMED;
  ax_values *v = NULL;
  if (err == AX_OK && (v = ax_values_new()))
    ax_values_add_i64(v, d + 1);
  ax_future_complete(p, err, v, ax_future_errmsg(nested));
  ax_future_release(p);
}

static int chain(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                 void *user) {
  int64_t depth;
  const char *nodes;
  AX_TRY(ax_values_get_i64(args, 0, &depth));
  AX_TRY(ax_values_get_str(args, 1, &nodes));
  if (depth <= 0)
    return ax_values_add_i64(out, 0);
  /* Next name: the one after ours in the list (wrapping), else the first. */
  ax_node *n = ax_call_node(ctx);
  const char *me = ax_node_name(n);
  char list[1024], *names[64];
  int cnt = 0, mine = -1;
  snprintf(list, sizeof list, "%s", nodes);
  for (char *s = strtok(list, ","); s && cnt < 64; s = strtok(NULL, ","))
    names[cnt++] = s;
  if (cnt == 0)
    return ax_seterr(AX_EINVAL, "chain: empty node list");
  for (int i = 0; i < cnt; i++)
    if (!strcmp(names[i], me))
      mine = i;
  const char *next = names[(mine + 1) % cnt];
  ax_values *a = ax_values_new();
  if (!a)
    return AX_ENOMEM;
  ax_values_add_i64(a, depth - 1);
  ax_values_add_str(a, nodes);
  ax_call_opts o = {.timeout_ms = ax_call_remaining_ms(ctx)};
  ax_future *nested;
  int rc = ax_rpc_async(n, next, "axon.test.chain", a, &o, &nested);
  ax_values_free(a);
  if (rc != AX_OK)
    return rc;
  ax_future *p = ax_future_new();
  if (!p) {
    ax_future_release(nested);
    return AX_ENOMEM;
  }
  ax_future_retain(p);
  ax_future_on_done(nested, chain_done, p); /* cannot fail but on no memory */
  ax_future_release(nested);
  rc = ax_call_defer(ctx, p);
  ax_future_release(p);
  return rc;
}

static int checksum(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  ax_tensor *t;
  AX_TRY(ax_values_get_tensor(args, 0, &t));
  ax_tensor *h = ax_tensor_to(t, AX_CPU);
  if (!h)
    return AX_ENOMEM;
  size_t nb = ax_tensor_nbytes(h);
  uint64_t c = ax_agent_checksum(h->data, nb);
  ax_tensor_release(h);
  AX_TRY(ax_values_add_i64(out, (int64_t)c));
  return ax_values_add_i64(out, (int64_t)nb);
}

static int make_tensor(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                       void *user) {
  int64_t n, seed;
  AX_TRY(ax_values_get_i64(args, 0, &n));
  AX_TRY(ax_values_get_i64(args, 1, &seed));
  if (n < 0 || n > (int64_t)1 << 30)
    return ax_seterr(AX_EINVAL, "make_tensor: bad size %lld", (long long)n);
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &n, AX_CPU);
  if (!t)
    return AX_ENOMEM;
  for (int64_t i = 0; i < n; i++)
    ax_f32(t)[i] = (float)(seed + i % 1000003);
  int rc = ax_values_add_tensor(out, t);
  ax_tensor_release(t);
  return rc;
}

static int device_of(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                     void *user) {
  for (size_t i = 0; i < ax_values_count(args); i++) {
    ax_tensor *t;
    char b[16];
    AX_TRY(ax_values_get_tensor(args, i, &t));
    AX_TRY(ax_values_add_str(out, ax_device_str(t->device, b, sizeof b)));
  }
  return AX_OK;
}

static int fail(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                void *user) {
  int64_t code;
  const char *msg;
  AX_TRY(ax_values_get_i64(args, 0, &code));
  AX_TRY(ax_values_get_str(args, 1, &msg));
  if (code <= 0 || code >= AX_ERR_MAX_)
    code = AX_EINTERNAL;
  return ax_seterr((int)code, "%s", msg);
}

static int sink(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                void *user) {
  int64_t nb = 0;
  for (size_t i = 0; i < ax_values_count(args); i++) {
    ax_tensor *t;
    if (ax_values_get_tensor(args, i, &t) == AX_OK)
      nb += (int64_t)ax_tensor_nbytes(t);
  }
  return ax_values_add_i64(out, nb);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Measures the link from this agent to `peer` as a pipeline's stages use
 * it: small calls (their median round trip) and large tensors (one way,
 * best of 3). Blocks a worker for the measurement: a diagnostic. */
static int probe(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                 void *user) {
  const char *peer;
  int64_t iters, bytes;
  AX_TRY(ax_values_get_str(args, 0, &peer));
  AX_TRY(ax_values_get_i64(args, 1, &iters));
  AX_TRY(ax_values_get_i64(args, 2, &bytes));
  if (iters < 1 || iters > 100000 || bytes < 4 || bytes > ((int64_t)1 << 31))
    return ax_seterr(AX_EINVAL, "probe: iters 1..100000, bytes 4..2G");
  ax_node *n = ax_call_node(ctx);
  ax_call_opts o = {.timeout_ms = 60000};
  double *rt = malloc(sizeof *rt * (size_t)iters);
  ax_values *a = ax_values_new();
  int rc = rt && a ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK)
    rc = ax_values_add_i64(a, 1);
  if (rc == AX_OK)
    rc = ax_values_add_i64(a, 2);
  /* one call first: connections are set up outside the measurement; the
   * small call is the sink's with two integers (no tensor) */
  for (int64_t i = -1; rc == AX_OK && i < iters; i++) {
    double t0 = ax_clock_s();
    rc = ax_rpc_sync(n, peer, "axon.agent.sink", a, &o, NULL);
    if (i >= 0)
      rt[i] = (ax_clock_s() - t0) * 1e6;
  }
  ax_values_free(a);
  double best = 0, rtt = 0;
  if (rc == AX_OK) {
    qsort(rt, (size_t)iters, sizeof *rt, cmp_double);
    rtt = rt[iters / 2];
  }
  free(rt);
  int64_t len = bytes / 4;
  ax_tensor *t = rc == AX_OK ? ax_tensor_new(AX_F32, 1, &len, AX_CPU) : NULL;
  if (rc == AX_OK && !t)
    rc = AX_ENOMEM;
  if (t)
    memset(t->data, 0, ax_tensor_nbytes(t));
  for (int r = 0; rc == AX_OK && r < 3; r++) {
    ax_values *b = ax_values_new();
    rc = b ? ax_values_add_tensor(b, t) : AX_ENOMEM;
    double t0 = ax_clock_s();
    if (rc == AX_OK)
      rc = ax_rpc_sync(n, peer, "axon.agent.sink", b, &o, NULL);
    /* the bytes' time: the call's less a small call's (latency) */
    double s = ax_clock_s() - t0, net = s - rtt * 1e-6;
    double gbit = (double)ax_tensor_nbytes(t) * 8 / (net > 0 ? net : s) / 1e9;
    best = gbit > best ? gbit : best;
    ax_values_free(b);
  }
  ax_tensor_release(t);
  if (rc == AX_OK)
    rc = ax_values_add_f64(out, rtt);
  if (rc == AX_OK)
    rc = ax_values_add_f64(out, best);
  return rc;
}

int ax_agent_register_builtins(ax_node *n) {
  AX_TRY(axi_register(n, "axon.agent.sink", sink, NULL));
  AX_TRY(axi_register(n, "axon.agent.probe", probe, NULL));
  AX_TRY(axi_register(n, "axon.test.echo", echo, NULL));
  AX_TRY(axi_register(n, "axon.test.add", add, NULL));
  AX_TRY(axi_register(n, "axon.test.sleep_ms", sleep_ms, NULL));
  AX_TRY(axi_register(n, "axon.test.chain", chain, NULL));
  AX_TRY(axi_register(n, "axon.test.checksum", checksum, NULL));
  AX_TRY(axi_register(n, "axon.test.make_tensor", make_tensor, NULL));
  AX_TRY(axi_register(n, "axon.test.device_of", device_of, NULL));
  AX_TRY(axi_register(n, "axon.test.push", push, NULL));
  return axi_register(n, "axon.test.fail", fail, NULL);
}
