/* The schedule verifier (verify.h): completeness, the counts per stage and
 * the fit; the deadlock simulation is in verify_sim.c. */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/verify-impl.h"

/* ---- completeness -------------------------------------------------------- */
/* "rank r action i (X)" for action o (which the plan has), into buf. */
static const char *where(const axi_verify *v, const ax_pipe_op *o, char *buf,
                         size_t len) {
  int r = ax_pipe_plan_stage_rank(v->p, o->stage);
  char t[32];
  ax_pipe_op_text(o, 0, t, sizeof t);
  long at = v->pos[axi_verify_key(v, o)] - 1;
  if (v->n > 1)
    snprintf(buf, len, "rank %d action %ld (%s of mini-batch %d)", r, at, t,
             o->batch);
  else
    snprintf(buf, len, "rank %d action %ld (%s)", r, at, t);
  return buf;
}

/* Indexes every action; a second copy of one is an error. */
static int index_plan(axi_verify *v, FILE *out) {
  for (int r = 0; r < v->K; r++)
    for (long i = 0; i < v->len[r]; i++) {
      size_t k = axi_verify_key(v, &v->ops[r][i]);
      if (v->count[k]) {
        char t[32];
        fprintf(out,
                "rank %d action %ld (%s): a second copy (the first is "
                "its action %ld)\n",
                r, i, ax_pipe_op_text(&v->ops[r][i], 0, t, sizeof t),
                v->pos[k] - 1);
        return AX_EINVAL;
      }
      v->count[k] = 1;
      v->pos[k] = i + 1;
    }
  return AX_OK;
}

static long pos_of(const axi_verify *v, int kind, int s, int t, int u) {
  ax_pipe_op o = {kind, s, t, u};
  return v->pos[axi_verify_key(v, &o)] - 1;
}

/* Unit (s, t, u): its F, then its B or its I and then W. */
static int check_unit(const axi_verify *v, int s, int t, int u, FILE *out) {
  long f = pos_of(v, AX_OP_FWD, s, t, u), b = pos_of(v, AX_OP_BWD, s, t, u),
       i = pos_of(v, AX_OP_INPUT_GRAD, s, t, u),
       w = pos_of(v, AX_OP_WEIGHT_GRAD, s, t, u);
  char at[96];
  int r = ax_pipe_plan_stage_rank(v->p, s);
  const char *name = ax_pipe_mode_name(ax_pipe_plan_mode(v->p));
  ax_pipe_op bo = {AX_OP_BWD, s, t, u}, io = {AX_OP_INPUT_GRAD, s, t, u},
             wo = {AX_OP_WEIGHT_GRAD, s, t, u};
  if (f < 0 || (b < 0 && i < 0)) {
    fprintf(out, "stage %d (rank %d): unit %d of mini-batch %d has no %s\n", s,
            r, u, t, f < 0 ? "F" : "B (nor I and W)");
    return AX_EINVAL;
  }
  if (b >= 0 && (i >= 0 || w >= 0)) {
    fprintf(out, "%s: the unit also has %s (a B or an I and a W, not both)\n",
            where(v, &bo, at, sizeof at), i >= 0 ? "an I" : "a W");
    return AX_EINVAL;
  }
  if (i >= 0 && w < 0) {
    fprintf(out, "%s: I without its W\n", where(v, &io, at, sizeof at));
    return AX_EINVAL;
  }
  if (b < 0 && i < 0 && w >= 0) {
    fprintf(out, "%s: W without its I\n", where(v, &wo, at, sizeof at));
    return AX_EINVAL;
  }
  const ax_pipe_op *g = b >= 0 ? &bo : &io;
  if ((b >= 0 ? b : i) < f) {
    fprintf(out, "%s: %s before its F (action %ld)\n",
            where(v, g, at, sizeof at), b >= 0 ? "B" : "I", f);
    return AX_EINVAL;
  }
  if (i >= 0 && w < i) {
    fprintf(out, "%s: W before its I (action %ld)\n",
            where(v, &wo, at, sizeof at), i);
    return AX_EINVAL;
  }
  /* A double-buffered forward of t uses the shadow of STEP(t-1), made
   * from the weights after STEP(t-2): that STEP must have run. */
  long before = t >= 2 ? pos_of(v, AX_OP_STEP, s, t - 2, 0) : -1;
  if (ax_pipe_mode_get(ax_pipe_plan_mode(v->p))->fwd_weights ==
          AX_FWD_DOUBLE_BUFFERED &&
      t >= 2 && f < before) {
    ax_pipe_op fo = {AX_OP_FWD, s, t, u};
    fprintf(out,
            "%s: %s forward of mini-batch %d before the STEP of %d "
            "(action %ld)\n",
            where(v, &fo, at, sizeof at), name, t, t - 2, before);
    return AX_EINVAL;
  }
  return AX_OK;
}

/* STEP(s, t): once, after its units' actions and the STEP before it; in
 * a flushed mode before every action of mini-batch t + 1. */
static int check_step(const axi_verify *v, int s, int t, FILE *out) {
  long st = pos_of(v, AX_OP_STEP, s, t, 0), last = -1, next = -1;
  int r = ax_pipe_plan_stage_rank(v->p, s);
  ax_pipe_op so = {AX_OP_STEP, s, t, 0}, lo = so;
  char at[96];
  if (st < 0) {
    fprintf(out, "stage %d (rank %d): mini-batch %d has no STEP\n", s, r, t);
    return AX_EINVAL;
  }
  for (int u = 0; u < v->U; u++)
    for (int k = AX_OP_FWD; k < AX_OP_STEP; k++) {
      long p = pos_of(v, k, s, t, u);
      if (p > last)
        last = p, lo = (ax_pipe_op){k, s, t, u};
      long q = t + 1 < v->n ? pos_of(v, k, s, t + 1, u) : -1;
      if (q >= 0 && (next < 0 || q < next))
        next = q;
    }
  if (last > st) {
    char tok[32];
    fprintf(out, "%s: STEP before %s (action %ld) of its mini-batch\n",
            where(v, &so, at, sizeof at),
            ax_pipe_op_text(&lo, 0, tok, sizeof tok), last);
    return AX_EINVAL;
  }
  long prev = t > 0 ? pos_of(v, AX_OP_STEP, s, t - 1, 0) : -1;
  if (t > 0 && prev > st) {
    fprintf(out, "%s: STEP before the STEP of mini-batch %d (action %ld)\n",
            where(v, &so, at, sizeof at), t - 1, prev);
    return AX_EINVAL;
  }
  if (ax_pipe_flushes(ax_pipe_plan_mode(v->p)) && next >= 0 && next < st) {
    fprintf(out,
            "%s: the mode flushes, and rank %d runs its action %ld, of "
            "mini-batch %d, before it\n",
            where(v, &so, at, sizeof at), r, next, t + 1);
    return AX_EINVAL;
  }
  return AX_OK;
}

static int complete(axi_verify *v, FILE *out) {
  AX_TRY(index_plan(v, out));
  for (int s = 0; s < v->S; s++)
    for (int t = 0; t < v->n; t++) {
      for (int u = 0; u < v->U; u++)
        AX_TRY(check_unit(v, s, t, u, out));
      AX_TRY(check_step(v, s, t, out));
    }
  return AX_OK;
}

/* ---- counts (verify.h, check 3) ------------------------------------------ */
static int count_states(const axi_verify *v, ax_pipe_verify_report *r) {
  const ax_pipe_mode_def *def = ax_pipe_mode_get(ax_pipe_plan_mode(v->p));
  int stash = def->bwd_weights == AX_WEIGHTS_STASHED,
      dbuf = def->fwd_weights == AX_FWD_DOUBLE_BUFFERED;
  long nv = v->n + 2;
  int *ver = malloc(sizeof *ver * ((size_t)v->S * (size_t)v->NU + 1));
  int *cnt = calloc((size_t)v->S * (size_t)nv + 1, sizeof *cnt);
  if (!ver || !cnt) {
    free(ver), free(cnt);
    return ax_seterr(AX_ENOMEM, "verify: out of memory");
  }
  int live[AX_PIPE_PLAN_MAX_STAGES] = {0}, steps[AX_PIPE_PLAN_MAX_STAGES] = {0},
      kept[AX_PIPE_PLAN_MAX_STAGES] = {0}; /* versions other than 0..: nz */
  for (int s = 0; s < v->S; s++)
    r->peak_live[s] = 0, r->peak_versions[s] = 1;
  for (int k = 0; k < v->K; k++)
    for (long i = 0; i < v->len[k]; i++) {
      const ax_pipe_op *o = &v->ops[k][i];
      int s = o->stage, *c = cnt + (size_t)s * (size_t)nv;
      size_t unit = (size_t)s * (size_t)v->NU + (size_t)o->batch * v->U +
                    (size_t)o->micro;
      if (o->kind == AX_OP_STEP) {
        steps[s]++;
      } else if (o->kind == AX_OP_FWD) {
        live[s]++;
        int t = o->batch, version = steps[s];
        if (dbuf && t >= 1 && steps[s] >= t)
          version = t - 1; /* the shadow of STEP(t - 1) */
        ver[unit] = stash ? version : -1;
        if (stash && c[version]++ == 0)
          kept[s]++;
      } else if (o->kind != AX_OP_INPUT_GRAD) { /* B or W: the unit ends */
        live[s]--;
        if (stash && --c[ver[unit]] == 0)
          kept[s]--;
      }
      int versions = 1 + kept[s] - (stash && c[steps[s]] > 0);
      if (live[s] > r->peak_live[s])
        r->peak_live[s] = live[s];
      if (versions > r->peak_versions[s])
        r->peak_versions[s] = versions;
    }
  free(ver), free(cnt);
  return AX_OK;
}

/* ---- fit (check 4) ------------------------------------------------------- */
/* Why rank k, over the cap, is refused: its stages, bytes and counts. */
static void over_cap(const axi_verify *v, const ax_pipe_verify_opts *o,
                     const ax_pipe_verify_report *r, const ax_stash_count *c,
                     int k, FILE *out) {
  int held = 0;
  for (int s = 0; s < v->S; s++)
    held += ax_pipe_plan_stage_rank(v->p, s) == k;
  fprintf(out, "rank %d (stage%s", k, held > 1 ? "s " : " ");
  for (int s = 0, i = 0; s < v->S; s++)
    if (ax_pipe_plan_stage_rank(v->p, s) == k)
      fprintf(out, "%s%d", i++ ? ", " : "", s);
  fprintf(out, ") needs %zu bytes, over the cap of %zu:", r->rank_mem[k],
          o->mem_cap);
  for (int s = 0, i = 0; s < v->S; s++) {
    if (ax_pipe_plan_stage_rank(v->p, s) != k)
      continue;
    if (held > 1)
      fprintf(out, "%s stage %d %zu bytes,", i++ ? ";" : "", s,
              r->stage_mem[s]);
    fprintf(out, " %d units live (%d with activations), %d weight versions",
            c[s].sets, c[s].activation_sets, c[s].weight_versions);
  }
  fprintf(out, "\n");
}

static int fit(const axi_verify *v, const ax_pipe_verify_opts *o,
               ax_pipe_verify_report *r, FILE *out) {
  int mode = ax_pipe_plan_mode(v->p);
  ax_stash_count c[AX_PIPE_PLAN_MAX_STAGES];
  for (int s = 0; s < v->S; s++)
    AX_TRY(ax_pipe_stash_of(mode, v->U, o->recompute, r->peak_live[s],
                            r->peak_versions[s], &c[s]));
  ax_partition_opts po = {.K = v->S,
                          .mode = ax_pipe_mode_name(mode),
                          .M = v->U,
                          .recompute = o->recompute,
                          .optim_copies = o->optim_copies,
                          .stash = c};
  r->ranks = v->K;
  for (int s = 0; s < v->S; s++) {
    r->stage_mem[s] = ax_stage_memory(o->stage_bytes, v->S, s, s + 1, s, &po);
    r->rank_mem[ax_pipe_plan_stage_rank(v->p, s)] += r->stage_mem[s];
  }
  for (int k = 0; o->mem_cap && k < v->K; k++)
    if (r->rank_mem[k] > o->mem_cap) {
      over_cap(v, o, r, c, k, out);
      return AX_EINVAL;
    }
  return AX_OK;
}

/* ---- the entry points ---------------------------------------------------- */
int ax_pipe_verify(const ax_pipe_plan *p, const ax_pipe_verify_opts *o,
                   ax_pipe_verify_report *r) {
  ax_pipe_verify_opts dflt = {0};
  ax_pipe_verify_report mine;
  if (!p)
    return ax_seterr(AX_EINVAL, "verify: no plan");
  o = o ? o : &dflt;
  r = r ? r : &mine;
  memset(r, 0, sizeof *r);
  axi_verify v = {p, ax_pipe_plan_ranks(p), ax_pipe_plan_stages(p),
                  ax_pipe_plan_units(p), ax_pipe_plan_batches(p)};
  v.NU = v.n * v.U;
  r->stages = v.S;
  for (int k = 0; k < v.K; k++)
    v.ops[k] = ax_pipe_plan_actions(p, k, &v.len[k]);
  size_t keys = (size_t)v.S * AX_OP_KINDS * (size_t)v.NU + 1;
  v.pos = calloc(keys, sizeof *v.pos);
  v.count = calloc(keys, 1);
  char *text = NULL;
  size_t size = 0;
  FILE *out = v.pos && v.count ? open_memstream(&text, &size) : NULL;
  int err = out ? complete(&v, out) : AX_ENOMEM;
  if (err == AX_OK)
    err = count_states(&v, r);
  if (err == AX_OK)
    err = axi_verify_deadlock(&v, o->grid_steps, out, &r->steps);
  if (err == AX_OK && o->stage_bytes)
    err = fit(&v, o, r, out);
  if (out)
    fclose(out);
  free(v.pos);
  free(v.count);
  if (err == AX_EINVAL && text) {
    size_t line = strcspn(text, "\n");
    ax_seterr(AX_EINVAL, "%.*s", (int)line, text);
    r->text = text;
    text = NULL;
  } else if (err == AX_ENOMEM) {
    ax_seterr(AX_ENOMEM, "verify: out of memory");
  }
  free(text);
  if (r == &mine)
    ax_pipe_verify_report_clear(r);
  return err;
}

void ax_pipe_verify_report_clear(ax_pipe_verify_report *r) {
  if (!r)
    return;
  free(r->text);
  r->text = NULL;
}

int ax_pipe_verify_mode(int mode, int K, int chunks, int M, long n) {
  ax_pipe_plan *p = NULL;
  AX_TRY(ax_pipe_plan_new(mode, K, chunks, M, n, &p));
  int err = ax_pipe_verify(p, NULL, NULL);
  ax_pipe_plan_free(p);
  if (err != AX_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ax_errmsg());
    return ax_seterr(err, "schedule %s (%d ranks, %d micro-batches): %s",
                     ax_pipe_mode_name(mode), K, M, msg);
  }
  return AX_OK;
}
