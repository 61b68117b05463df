/* The data dependencies and forward locking of the stage-event oracle
 * (pipe_eventcheck.h, which includes this after its context; not for
 * direct use):
 *  - from the test's own definition and NOT from ax_pipe_deps (which the
 *    coordinator waits on): stage s > 0 receives unit u's activations
 *    exactly once from s - 1 and stage s < S - 1 its gradient exactly once
 *    from s + 1 (in split modes, for its I), also where both stages are on
 *    one agent (chunk boundaries); the producer's compute of u ended before
 *    it started sending, the receive ended after that send started and
 *    before the consumer started computing (its recompute, when it
 *    replays). So the consumer started computing after the producer
 *    finished. The send's END is not used: the bytes may be taken by the
 *    consumer before the producer's thread stamps the end of its send;
 *  - ddg and fr forward locking (mode.h): stage 0's F(t) starts after
 *    F(K-1, t-1) and every backward of round t-1 (B(j, t-1-(K-1-j))) and
 *    its optimizer step ended. */
#ifndef AX_PIPE_EVENTDEPS_H
#define AX_PIPE_EVENTDEPS_H

/* A receive or send event: counted for the operation it belongs to. */
static inline int pe_xfer(pe_ctx *c, const ax_trace_event *x) {
  int s = x->pid, send = x->tid == 2, m = (int)x->micro, slot;
  if (m < 0 || m >= c->U)
    return pe_fail(c, "stage %d: %s with micro %d outside [0, %d)", s, x->name,
                   m, c->U);
  if (x->peer == s + 1 && x->peer < c->S)
    slot = send ? PE_F : PE_B; /* activations out, gradient in */
  else if (x->peer == s - 1 && x->peer >= 0)
    slot = send ? PE_B : PE_F; /* gradient out, activations in */
  else
    return pe_fail(c, "stage %d: %s with peer %lld, not a neighbour", s,
                   x->name, (long long)x->peer);
  pe_op *r = pe_at(c, s, slot, (long)x->step, m);
  if (send) {
    r->nsend++;
    r->send_start = x->ts_us;
  } else {
    r->nrecv++;
    r->recv_end = x->ts_us + x->dur_us;
  }
  return 0;
}

/* The data dependency of consumer op (s, slot, b, m) on producer stage p. */
static inline int pe_dep(pe_ctx *c, int s, int slot, long b, int m, int p) {
  const char *what = slot == PE_F ? "activations" : "gradient";
  const char *op = slot == PE_F ? "forward" : "backward";
  const pe_op *q = pe_at(c, p, slot, b, m), *r = pe_at(c, s, slot, b, m);
  if (r->nrecv != 1 || q->nsend != 1)
    return pe_fail(c,
                   "%s of %ld/%d: stage %d received its %s %d times, stage "
                   "%d sent them %d times (want 1 and 1)",
                   op, b, m, s, what, r->nrecv, p, q->nsend);
  if (q->send_start < q->end)
    return pe_fail(c,
                   "stage %d started sending the %s of %ld/%d at +%lld us, "
                   "before its %s ended at +%lld us",
                   p, what, b, m, pe_rel(c, q->send_start), op,
                   pe_rel(c, q->end));
  if (r->recv_end < q->send_start)
    return pe_fail(c,
                   "stage %d received the %s of %ld/%d at +%lld us, before "
                   "stage %d started sending them at +%lld us",
                   s, what, b, m, pe_rel(c, r->recv_end), p,
                   pe_rel(c, q->send_start));
  if (r->start < r->recv_end)
    return pe_fail(c,
                   "stage %d started computing its %s of %ld/%d at +%lld "
                   "us, before its %s arrived (receive ended +%lld us)",
                   s, op, b, m, pe_rel(c, r->start), what,
                   pe_rel(c, r->recv_end));
  return 0;
}

/* ddg and fr (single-chunk): stage 0's F(t) waits for the end of round
 * t - 1. */
static inline int pe_forward_lock(pe_ctx *c) {
  for (long t = 1; t < c->n; t++) {
    const pe_op *f = pe_at(c, 0, PE_F, t, 0);
    const pe_op *last = pe_at(c, c->S - 1, PE_F, t - 1, 0);
    if (f->start < last->done)
      return pe_fail(c,
                     "stage 0 started F%ld at +%lld us, before stage %d's "
                     "F%ld ended at +%lld us (forward locking)",
                     t, pe_rel(c, f->start), c->S - 1, t - 1,
                     pe_rel(c, last->done));
    for (int j = 0; j < c->S; j++) {
      long b = t - 1 - (c->S - 1 - j);
      const pe_op *bw = b >= 0 ? pe_at(c, j, PE_B, b, 0) : NULL;
      if (bw && f->start < bw->done)
        return pe_fail(c,
                       "stage 0 started F%ld at +%lld us, before stage %d's "
                       "B%ld (and its update) ended at +%lld us (forward "
                       "locking)",
                       t, pe_rel(c, f->start), j, b, pe_rel(c, bw->done));
    }
  }
  return 0;
}

/* Every transfer and data dependency of the run. */
static inline int pe_transfers(pe_ctx *c) {
  for (int s = 0; s < c->S; s++)
    for (long b = 0; b < c->n; b++)
      for (int m = 0; m < c->U; m++) {
        if (s > 0 && pe_dep(c, s, PE_F, b, m, s - 1))
          return 1;
        if (s < c->S - 1 && pe_dep(c, s, PE_B, b, m, s + 1))
          return 1;
        if (s == 0 &&
            (pe_at(c, s, PE_F, b, m)->nrecv || pe_at(c, s, PE_B, b, m)->nsend))
          return pe_fail(c,
                         "stage 0 received activations or sent a "
                         "gradient for %ld/%d",
                         b, m);
        if (s == c->S - 1 &&
            (pe_at(c, s, PE_B, b, m)->nrecv || pe_at(c, s, PE_F, b, m)->nsend))
          return pe_fail(c,
                         "the last stage sent activations or received "
                         "a gradient for %ld/%d",
                         b, m);
      }
  return 0;
}

#endif
