/* The V modes' generators (mode_v-impl.h): DualPipeV, V-Half and V-Min. */
#include "axon/runtime/pipeline/schedule/mode_v-impl.h"

#include <stdlib.h>

static ax_pipe_op op(int kind, int s, int m) {
  ax_pipe_op o = {kind, s, 0, m, 0};
  return o;
}

void axi_vmode_repeat(const ax_pipe_op *one, long len, int K, int r, long n,
                      ax_pipe_op *out, long *k) {
  for (long t = 0; t < n; t++) {
    for (long i = 0; i < len; i++) {
      out[*k] = one[i];
      out[(*k)++].batch = (int)t;
    }
    out[*k] = op(AX_OP_STEP, r, 0);
    out[(*k)++].batch = (int)t;
    out[*k] = op(AX_OP_STEP, 2 * K - 1 - r, 0);
    out[(*k)++].batch = (int)t;
  }
}

/* ---- DualPipeV ------------------------------------------------------------
 */
/* DualPipe's V form (DeepSeek-AI 2025; Sea AI Lab's "cut-in-half"). Rank r
 * has phase 0 (stage r) and phase 1 (stage 2K - 1 - r); each phase takes
 * its units in order, and every I queues its W, run first in first out.
 * With d = K - 1 - r, one mini-batch of U >= 2K units is
 *   1. 2d forwards of phase 0;
 *   2. r + 1 times: F0, F1;
 *   3. d times: I1, W (that I's), F1;
 *   4. U - 2K + r + 1 times: F0 & B1, then F1 & B0 (on rank K - 1 the
 *      first F0 and B1 run apart, one after the other);
 *   5. d times: B1, F1 & B0;
 *   6. r + 1 times: B1, B0, the second half of them as I (from the
 *      middle on: for an odd r from its B1, for an even r from its B0);
 *   7. d times: W, I0;
 *   8. r + 1 times: W.
 * "X & Y" is one composite action (ax_pipe_op.with_next): the forward and
 * the backward of two units start together when both inputs are there.
 * With F = I = W per stage the bubble is (K - 1)(F&B + B - 3W), DualPipe's
 * README's (PP / 2 - 1)(F&B + B - 3W) with PP = 2K stages (F&B = F + B
 * here: the parts run one after the other). Stage s keeps at most 2K - s
 * units (s < K; its partner 2K - 1 - s keeps s + 1), so a rank keeps
 * 2K + 1 half-size units at most: the README's PP + 1. */
typedef struct dpv {
  ax_pipe_op *o;
  long k;
  int st[2], f[2], b[2];
  int *wq, head, tail; /* stages and units of the I whose W is due */
} dpv;

static void dpv_f(dpv *d, int ph, int with_next) {
  d->o[d->k] = op(AX_OP_FWD, d->st[ph], d->f[ph]++);
  d->o[d->k++].with_next = with_next;
}

static void dpv_b(dpv *d, int ph, int split) {
  int u = d->b[ph]++;
  d->o[d->k++] = op(split ? AX_OP_INPUT_GRAD : AX_OP_BWD, d->st[ph], u);
  if (split) {
    d->wq[2 * d->tail] = d->st[ph];
    d->wq[2 * d->tail++ + 1] = u;
  }
}

static void dpv_w(dpv *d) {
  int s = d->wq[2 * d->head], u = d->wq[2 * d->head + 1];
  d->head++;
  d->o[d->k++] = op(AX_OP_WEIGHT_GRAD, s, u);
}

/* Rank r's one mini-batch into o (room for 6U); returns its length, or -1
 * without memory. */
static long dpv_one(int K, int r, int U, ax_pipe_op *o) {
  int d0 = K - 1 - r;
  dpv d = {o, 0, {r, 2 * K - 1 - r}, {0, 0}, {0, 0}, NULL, 0, 0};
  if (!(d.wq = malloc(sizeof *d.wq * 4 * (size_t)U)))
    return -1;
  for (int i = 0; i < 2 * d0; i++)
    dpv_f(&d, 0, 0);
  for (int i = 0; i < r + 1; i++)
    dpv_f(&d, 0, 0), dpv_f(&d, 1, 0);
  for (int i = 0; i < d0; i++)
    dpv_b(&d, 1, 1), dpv_w(&d), dpv_f(&d, 1, 0);
  for (int i = 0; i < U - 2 * K + r + 1; i++) {
    dpv_f(&d, 0, !(i == 0 && r == K - 1));
    dpv_b(&d, 1, 0);
    dpv_f(&d, 1, 1);
    dpv_b(&d, 0, 0);
  }
  for (int i = 0; i < d0; i++)
    dpv_b(&d, 1, 0), dpv_f(&d, 1, 1), dpv_b(&d, 0, 0);
  int split = 0, half = (r + 1) / 2;
  for (int i = 0; i < r + 1; i++) {
    split |= i == half && r % 2 == 1;
    dpv_b(&d, 1, split);
    split |= i == half && r % 2 == 0;
    dpv_b(&d, 0, split);
  }
  for (int i = 0; i < d0; i++)
    dpv_w(&d), dpv_b(&d, 0, 1);
  for (int i = 0; i < r + 1; i++)
    dpv_w(&d);
  free(d.wq);
  return d.k;
}

int axi_vmode_weight_halves_dualpipev(int K, int r, int U) {
  return 2 * K - 1 - r;
}

/* ---- V-Half and V-Min -----------------------------------------------------
 */
/* Qi et al. 2024, "Pipeline Parallelism with Controllable Memory": every
 * unit repeats one building block, 6 slots per unit and rank (F and I of
 * both stages, two W), so a unit's lifespan on a stage, and with it the
 * peak memory, is fixed by where the block puts its four slots: the F of
 * stage r, the F of stage 2K - 1 - r, the I of 2K - 1 - r and the I of r,
 * at slot[j] + 6 u for unit u (their generators' stable patterns). The gap
 * keeps the four slots distinct modulo 6. A W takes the first free slot
 * after its I (the second arm's first), the rest go at the end. The order
 * is the slots' order; the stages run it as soon as the inputs allow.
 * V-Min keeps about a third of 1F1B's activations ((K + 4) / 3 units of
 * a whole rank's layers against K) with a bubble about 2/3 of 1F1B's;
 * V-Half about half ((K + 2) / 2) with about 1/2 to 2/3 of the bubble
 * (the paper's reordering of the warm-up and cool-down, not done here,
 * brings it to 1/3 - 1/2). */
static void block_vmin(int K, int r, int slot[4]) {
  int gap = K % 3 == 0 ? 2 : 0;
  slot[0] = r, slot[1] = 2 * K - 1 - r;
  slot[2] = 2 * K + gap + r, slot[3] = 4 * K + gap - 1 - r;
}

static void block_vhalf(int K, int r, int slot[4]) {
  int gap = K % 2 == 0 ? 3 : 0;
  slot[0] = 2 * r, slot[1] = 3 * K - r - 2;
  slot[2] = 3 * K + gap + 2 * r - 1, slot[3] = 6 * K + gap - r - 2;
}

/* Rank r's one mini-batch from its block into o (room for 6U); returns
 * its length, or -1 without memory. */
static long block_one(void (*block)(int, int, int[4]), int K, int r, int U,
                      ax_pipe_op *o) {
  static const int kinds[4] = {AX_OP_FWD, AX_OP_FWD, AX_OP_INPUT_GRAD,
                               AX_OP_INPUT_GRAD};
  int slot[4], stage[4] = {r, 2 * K - 1 - r, 2 * K - 1 - r, r}, last = 0;
  block(K, r, slot);
  for (int j = 0; j < 4; j++)
    last = slot[j] > last ? slot[j] : last;
  /* W queues: the second arm's (stage 2K - 1 - r), the first arm's */
  int *q = malloc(sizeof *q * 2 * (size_t)U), head[2] = {0, 0},
      tail[2] = {0, 0};
  if (!q)
    return -1;
  long k = 0;
  for (long i = 0; i <= last + 6L * (U - 1); i++) {
    int j = 0;
    while (j < 4 &&
           !(i >= slot[j] && (i - slot[j]) % 6 == 0 && (i - slot[j]) / 6 < U))
      j++;
    if (j < 4) {
      int u = (int)((i - slot[j]) / 6);
      o[k++] = op(kinds[j], stage[j], u);
      if (j >= 2)
        q[(j - 2) * U + tail[j - 2]++] = u;
      continue;
    }
    for (int w = 0; w < 2; w++) /* a free slot */
      if (head[w] < tail[w]) {
        o[k++] = op(AX_OP_WEIGHT_GRAD, stage[2 + w], q[w * U + head[w]++]);
        break;
      }
  }
  for (int w = 0; w < 2; w++)
    while (head[w] < tail[w])
      o[k++] = op(AX_OP_WEIGHT_GRAD, stage[2 + w], q[w * U + head[w]++]);
  free(q);
  return k;
}

static long vhalf_one(int K, int r, int U, ax_pipe_op *o) {
  return block_one(block_vhalf, K, r, U, o);
}

static long vmin_one(int K, int r, int U, ax_pipe_op *o) {
  return block_one(block_vmin, K, r, U, o);
}

/* ---- the table's functions ------------------------------------------------
 */
typedef long (*one_fn)(int K, int r, int U, ax_pipe_op *o);

static void act(one_fn one, int K, int r, int U, long n, ax_pipe_op *out,
                long *k) {
  ax_pipe_op *l = malloc(sizeof *l * (6 * (size_t)U + 1));
  long len = l ? one(K, r, U, l) : -1;
  if (len >= 0) /* else the caller sees a short list (AX_EINTERNAL) */
    axi_vmode_repeat(l, len, K, r, n, out, k);
  free(l);
}

/* The most units stage s of S = 2K keeps at once on its rank's list. */
static int live(one_fn one, int S, int s, int U) {
  int K = S / 2, r = s < K ? s : S - 1 - s, now = 0, peak = 0;
  ax_pipe_op *l =
      S % 2 || s < 0 || s >= S ? NULL : malloc(sizeof *l * (6 * (size_t)U + 1));
  long len = l ? one(K, r, U, l) : -1;
  for (long i = 0; i < len; i++) {
    if (l[i].stage != s)
      continue;
    now += l[i].kind == AX_OP_FWD                                     ? 1
           : l[i].kind == AX_OP_BWD || l[i].kind == AX_OP_WEIGHT_GRAD ? -1
                                                                      : 0;
    peak = now > peak ? now : peak;
  }
  free(l);
  return len < 0 ? U : peak;
}

void axi_vmode_act_dualpipev(int K, int v, int r, int U, long n,
                             ax_pipe_op *out, long *k) {
  act(dpv_one, K, r, U, n, out, k);
}

void axi_vmode_act_vhalf(int K, int v, int r, int U, long n, ax_pipe_op *out,
                         long *k) {
  act(vhalf_one, K, r, U, n, out, k);
}

void axi_vmode_act_vmin(int K, int v, int r, int U, long n, ax_pipe_op *out,
                        long *k) {
  act(vmin_one, K, r, U, n, out, k);
}

int axi_vmode_live_dualpipev(int S, int s, int U) {
  return U < S ? U : live(dpv_one, S, s, U); /* it needs U >= 2K = S */
}

int axi_vmode_live_vhalf(int S, int s, int U) {
  return live(vhalf_one, S, s, U);
}

int axi_vmode_live_vmin(int S, int s, int U) { return live(vmin_one, S, s, U); }
