/* Shared helpers of the libFuzzer harnesses (see fuzz_common.h). */
#include "tests/fuzz/fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/value-impl.h"

void fuzz_fail(const char *file, int line, const char *what) {
  fprintf(stderr, "%s:%d: invariant failed: %s (last axon error: %s)\n", file,
          line, what, ax_errmsg());
  abort();
}

/* A control transport that carries nothing: the harnesses start no
 * transport, and whatever the code under test sends is refused. */
static int stub_send(axi_transport *t, axi_peer *p, const axi_msg *m,
                     axi_stream *via) {
  (void)t, (void)p, (void)m, (void)via;
  return ax_seterr(AX_EPEERDOWN, "fuzz: no transport");
}
static void stub_drop(axi_transport *t, axi_peer *p) { (void)t, (void)p; }
static int stub_connect(axi_transport *t, axi_peer *p) {
  (void)t, (void)p;
  return ax_seterr(AX_EPEERDOWN, "fuzz: no transport");
}
static int stub_alive(axi_stream *s) { return s != NULL; }
static void stub_ref(axi_stream *s, int d) { (void)s, (void)d; }
static const axi_transport_ops g_stub_ops = {.name = "fuzz-stub",
                                             .role = AXI_TRANSPORT_CONTROL,
                                             .send = stub_send,
                                             .drop_peer = stub_drop,
                                             .connect = stub_connect,
                                             .alive = stub_alive,
                                             .ref = stub_ref};

ax_node *fuzz_node_new(const char *name, int world, int rank, int auth) {
  ax_node *n = calloc(1, sizeof *n);
  FUZZ_CHECK(n);
  ax_node_opts_init(&n->o);
  n->name = strdup(name);
  n->listen = strdup("127.0.0.1:7000");
  FUZZ_CHECK(n->name && n->listen);
  snprintf(n->addr, sizeof n->addr, "127.0.0.1:7000");
  snprintf(n->bulk_addr, sizeof n->bulk_addr, "127.0.0.1:7001");
  n->o.name = n->name;
  n->o.listen = n->listen;
  n->o.world_size = world;
  n->o.rank = rank;
  n->rank = -1;
  pthread_mutex_init(&n->mu, NULL);
  pthread_cond_init(&n->cv, NULL);
  FUZZ_CHECK(axi_pcalls_init(n) == AX_OK);
  pthread_rwlock_init(&n->data_lk, NULL);
  axi_transport *ctl = calloc(1, sizeof *ctl);
  FUZZ_CHECK(ctl);
  ctl->ops = &g_stub_ops;
  ctl->node = n;
  n->ctl = ctl;
  pthread_cond_init(&n->q_cv, NULL);
  n->q_tail = &n->q_head;
  n->held_tail = &n->held_head;
  /* Past the first 20 refusals the node logs only every 1000th: the
   * harness's millions of inputs do not flood stderr. */
  n->limit_drops = n->auth_refused = 20;
  if (auth) {
    n->token_len = strlen(FUZZ_TOKEN);
    memcpy(n->token, FUZZ_TOKEN, n->token_len);
  }
  return n;
}

void fuzz_node_free(ax_node *n) {
  if (!n)
    return;
  /* Nothing here queues calls: the code under test must not either. */
  FUZZ_CHECK(!n->q_head && !n->held_head);
  for (axi_peer *p = n->peers; p; p = p->next)
    FUZZ_CHECK(p->rx_inflight == 0); /* every budget given back */
  axi_rendezvous_close(n);
  free(n->ctl); /* the stub of fuzz_node_new, not a real transport */
  n->ctl = NULL;
  pthread_cond_destroy(&n->q_cv);
  axi_node_free(n); /* the rest as ax_node_destroy frees it */
}

uint8_t fuzz_u8(fuzz_in *in) { return in->off < in->n ? in->p[in->off++] : 0; }

uint32_t fuzz_u32(fuzz_in *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)fuzz_u8(in) << (8 * i);
  return v;
}

const uint8_t *fuzz_bytes(fuzz_in *in, size_t want, size_t *got) {
  size_t left = in->n - in->off;
  *got = want < left ? want : left;
  const uint8_t *p = in->p + in->off;
  in->off += *got;
  return p;
}

int fuzz_values_equal(const ax_values *a, const ax_values *b) {
  if (ax_values_count(a) != ax_values_count(b))
    return 0;
  for (size_t i = 0; i < ax_values_count(a); i++) {
    const axi_value *x = &a->v[i], *y = &b->v[i];
    if (x->type != y->type)
      return 0;
    switch (x->type) {
    case AX_VAL_I64:
    case AX_VAL_F64:
      if (memcmp(&x->u.i, &y->u.i, sizeof x->u.i))
        return 0;
      break;
    case AX_VAL_STR:
      if (strcmp(x->u.buf.p, y->u.buf.p))
        return 0;
      break;
    case AX_VAL_BYTES:
      if (x->u.buf.n != y->u.buf.n ||
          (x->u.buf.n && memcmp(x->u.buf.p, y->u.buf.p, x->u.buf.n)))
        return 0;
      break;
    case AX_VAL_TENSOR: {
      const ax_tensor *s = x->u.t, *t = y->u.t;
      if (s == t) /* a list encoded back shares the input's tensors */
        break;
      size_t nb = ax_tensor_nbytes(s);
      if (s->dtype != t->dtype || s->ndim != t->ndim ||
          memcmp(s->shape, t->shape, sizeof s->shape[0] * (size_t)s->ndim) ||
          nb != ax_tensor_nbytes(t) || (nb && memcmp(s->data, t->data, nb)))
        return 0;
      break;
    }
    case AX_VAL_EXT:
      if (x->u.ext.kind != y->u.ext.kind)
        return 0;
      break;
    }
  }
  return 1;
}
