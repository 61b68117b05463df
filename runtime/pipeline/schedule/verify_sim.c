/* The verifier's deadlock check (verify.h, check 2): the plan simulated in
 * unit steps under the runtime's waits; on a stop, the cycle of waiting
 * ranks and a rank x step grid of the steps before it. */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/verify-impl.h"

#define TOKEN 32
#define MAX_GRID 64

typedef struct sim {
  const axi_verify *v;
  long *done; /* per key: 1 + the step the action ran in; 0: not yet */
  long *at;   /* per action of every rank (at + off[r]): its step, -1 */
  long off[AX_PIPE_PLAN_MAX_STAGES], pc[AX_PIPE_PLAN_MAX_STAGES];
} sim;

/* Whether action o (the first part of a composite: both parts' waits) can
 * start at `step`; when not, the first dependency not done goes to *dep. */
static int can_start(const sim *s, const ax_pipe_op *o, long step,
                     ax_pipe_op *dep) {
  ax_pipe_op deps[2 * AX_PIPE_PLAN_MAX_STAGES + 4];
  int nd = ax_pipe_plan_deps(s->v->p, o, deps);
  for (int i = 0; i < nd; i++) {
    long d = s->done[axi_verify_key(s->v, &deps[i])];
    if (d == 0 || d > step) {
      *dep = deps[i];
      return 0;
    }
  }
  return 1;
}

/* Runs every rank's list until all ended or none can move; returns the
 * steps taken. */
static long simulate(sim *s) {
  const axi_verify *v = s->v;
  long left = 0, step = 0;
  for (int r = 0; r < v->K; r++)
    left += v->len[r];
  while (left > 0) {
    int moved = 0;
    for (int r = 0; r < v->K; r++) {
      long i = s->pc[r];
      ax_pipe_op dep;
      if (i >= v->len[r] || !can_start(s, &v->ops[r][i], step, &dep))
        continue;
      int parts = v->ops[r][i].with_next ? 2 : 1;
      for (int k = 0; k < parts; k++) {
        s->done[axi_verify_key(v, &v->ops[r][i + k])] = step + 1;
        s->at[s->off[r] + i + k] = step;
      }
      s->pc[r] += parts;
      left -= parts;
      moved = 1;
    }
    if (!moved)
      break;
    step++;
  }
  return step;
}

/* The token of o (both parts of a composite), with its mini-batch when
 * the plan has several. */
static const char *named(const axi_verify *v, const ax_pipe_op *o, char *buf,
                         size_t len) {
  char t[TOKEN];
  ax_pipe_action_text(o, 0, t, sizeof t);
  if (v->n > 1)
    snprintf(buf, len, "%s of mini-batch %d", t, o->batch);
  else
    snprintf(buf, len, "%s", t);
  return buf;
}

/* "rank r waits at action i (X) for Y on rank q (its action j)"; after
 * the first, ", which waits at ..." (rank r being the q before). */
static void write_wait(const sim *s, int r, const ax_pipe_op *dep, int first,
                       FILE *out) {
  const axi_verify *v = s->v;
  char a[TOKEN + 32], b[TOKEN + 32];
  ax_pipe_op d = *dep;
  d.with_next = 0;
  long at = v->pos[axi_verify_key(v, &d)] - 1;
  if (first)
    fprintf(out, "rank %d", r);
  else
    fprintf(out, ", which");
  fprintf(out, " waits at action %ld (%s) for %s", s->pc[r],
          named(v, &v->ops[r][s->pc[r]], a, sizeof a),
          named(v, &d, b, sizeof b));
  if (at < 0)
    fprintf(out, ", which no rank's list has");
  else
    fprintf(out, " on rank %d (its action %ld)",
            ax_pipe_plan_stage_rank(v->p, d.stage), at);
}

/* Writes the cycle: from the first blocked rank, "waits for an action of
 * rank q" until a rank comes back (or, never after the completeness
 * check, an action no list has). */
static void write_cycle(const sim *s, long step, FILE *out) {
  const axi_verify *v = s->v;
  int next[AX_PIPE_PLAN_MAX_STAGES], seen[AX_PIPE_PLAN_MAX_STAGES];
  ax_pipe_op dep[AX_PIPE_PLAN_MAX_STAGES];
  int start = -1;
  for (int r = 0; r < v->K; r++) {
    seen[r] = 0;
    next[r] = -1;
    if (s->pc[r] >= v->len[r] ||
        can_start(s, &v->ops[r][s->pc[r]], step, &dep[r]))
      continue;
    if (v->pos[axi_verify_key(v, &dep[r])])
      next[r] = ax_pipe_plan_stage_rank(v->p, dep[r].stage);
    if (start < 0)
      start = r;
  }
  int r = start;
  while (r >= 0 && !seen[r]) {
    seen[r] = 1;
    r = next[r];
  }
  fprintf(out, "deadlock: ");
  if (r < 0) { /* a chain that ends at an action no list has */
    for (r = start; r >= 0; r = next[r])
      write_wait(s, r, &dep[r], r == start, out);
    fputc('\n', out);
    return;
  }
  int from = r; /* the cycle: the ranks before it only wait for it */
  do {
    write_wait(s, r, &dep[r], r == from, out);
    r = next[r];
  } while (r != from);
  fprintf(out, ", back to rank %d\n", from);
}

/* The grid of steps [lo, step) and each blocked rank's stuck action. */
static int write_grid(const sim *s, long step, int steps, FILE *out) {
  const axi_verify *v = s->v;
  long lo = step > steps ? step - steps : 0, cols = step - lo;
  char(*cell)[TOKEN] = calloc((size_t)v->K * (size_t)(cols + 1), TOKEN);
  if (!cell)
    return ax_seterr(AX_ENOMEM, "verify: out of memory");
  int w = snprintf(NULL, 0, "%ld", step);
  for (int r = 0; r < v->K; r++) {
    char(*row)[TOKEN] = cell + (size_t)r * (size_t)(cols + 1);
    for (long c = 0; c < cols; c++)
      snprintf(row[c], TOKEN, ".");
    long i = s->pc[r];
    while (i > 0 && s->at[s->off[r] + i - 1] >= lo)
      i--;
    for (; i < s->pc[r]; i++)
      if (!(i > 0 && v->ops[r][i - 1].with_next))
        ax_pipe_action_text(&v->ops[r][i], 0, row[s->at[s->off[r] + i] - lo],
                            TOKEN);
    if (s->pc[r] < v->len[r])
      ax_pipe_action_text(&v->ops[r][s->pc[r]], 0, row[cols], TOKEN);
    for (long c = 0; c <= cols; c++)
      if ((int)strlen(row[c]) > w)
        w = (int)strlen(row[c]);
  }
  fprintf(out, "%-8s", "step");
  for (long c = 0; c < cols; c++)
    fprintf(out, " %*ld", w, lo + c);
  fprintf(out, " | waits at\n");
  for (int r = 0; r < v->K; r++) {
    char(*row)[TOKEN] = cell + (size_t)r * (size_t)(cols + 1);
    fprintf(out, "rank %-3d", r);
    for (long c = 0; c < cols; c++)
      fprintf(out, " %*s", w, row[c]);
    if (s->pc[r] < v->len[r])
      fprintf(out, " | %-*s <-- here\n", w, row[cols]);
    else
      fprintf(out, " | (done)\n");
  }
  free(cell);
  return AX_OK;
}

int axi_verify_deadlock(const axi_verify *v, int grid_steps, FILE *out,
                        long *steps) {
  sim s = {v};
  long total = 0;
  for (int r = 0; r < v->K; r++) {
    s.off[r] = total;
    total += v->len[r];
  }
  s.done =
      calloc((size_t)v->S * AX_OP_KINDS * (size_t)v->NU + 1, sizeof *s.done);
  s.at = malloc(sizeof *s.at * ((size_t)total + 1));
  int err = AX_OK;
  if (!s.done || !s.at)
    err = ax_seterr(AX_ENOMEM, "verify: out of memory");
  long step = err == AX_OK ? simulate(&s) : 0;
  int stuck = 0;
  for (int r = 0; err == AX_OK && r < v->K; r++)
    stuck |= s.pc[r] < v->len[r];
  *steps = stuck ? 0 : step;
  if (err == AX_OK && stuck) {
    write_cycle(&s, step, out);
    if (grid_steps < 1)
      grid_steps = 16;
    err = write_grid(&s, step, grid_steps > MAX_GRID ? MAX_GRID : grid_steps,
                     out);
    if (err == AX_OK)
      err = AX_EINVAL;
  }
  free(s.done);
  free(s.at);
  return err;
}
