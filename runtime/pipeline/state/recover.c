/* Live recovery of a replicated pipeline, the coordinator's side
 * (recover.h); the stages' side is stage_boundary.c, the copies in memory
 * ckpt_memory.c and stage_ckpt_mem.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/ckpt_memory-impl.h"
#include "axon/runtime/pipeline/state/recover.h"

int ax_pipe_live_check(const ax_pipe *p) {
  const ax_pipe *one = p->nrep ? p->rep[0] : p;
  int T = axi_pipe_members(p), R = p->nrep ? p->nrep / T : 1;
  if (R < 2)
    return ax_seterr(AX_EUNSUPPORTED,
                     "live recovery: with one replica no other agent holds "
                     "a lost stage's state");
  if (!ax_pipe_flushes(one->o.mode))
    return ax_seterr(AX_EUNSUPPORTED,
                     "live recovery: %s does not flush, so the units in "
                     "flight used weight versions that no replica keeps "
                     "(there is no step boundary to go back to)",
                     ax_pipe_mode_name(one->o.mode));
  if (one->o.zero)
    return ax_seterr(AX_EUNSUPPORTED,
                     "live recovery: with zero each replica's agent holds "
                     "the only copy of its shard of the optimizer state");
  if (one->optim_host[0] || p->frozen)
    return ax_seterr(AX_EUNSUPPORTED,
                     "live recovery: the optimizer state on an optimizer "
                     "host, or a frozen prefix on the coordinator, is not "
                     "in the stages' state");
  return AX_OK;
}

/* "boundary" on every stage of every part but the skipped ones. */
typedef struct bnd_args {
  axi_pipe_boundary_msg m;
  const unsigned char *skip; /* [parts S], or NULL */
  int part, S;
  long *last, *kept; /* [parts S] replies, or NULL */
} bnd_args;

static int bnd_args_of(void *user, int s, ax_values **out) {
  bnd_args *a = user;
  *out = NULL;
  if (a->skip && a->skip[a->part * a->S + s])
    return AX_OK; /* its agent is lost */
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_boundary_encode(&a->m, v) : AX_ENOMEM;
}

static int bnd_reply(void *user, int s, const ax_values *r) {
  bnd_args *a = user;
  axi_pipe_boundary_reply_msg m;
  AX_TRY(axi_pipe_boundary_reply_decode(r, &m));
  if (a->last) {
    a->last[a->part * a->S + s] = (long)m.last_step;
    a->kept[a->part * a->S + s] = (long)m.kept;
  }
  return AX_OK;
}

static int all_parts(ax_pipe *p, bnd_args *a) {
  int n = p->nrep ? p->nrep : 1;
  for (a->part = 0; a->part < n; a->part++)
    AX_TRY(axi_pipe_all_stages(p->nrep ? p->rep[a->part] : p, 0, "boundary",
                               bnd_args_of, bnd_reply, a));
  return AX_OK;
}

int ax_pipe_keep_boundary(ax_pipe *p) {
  AX_TRY(ax_pipe_live_check(p));
  bnd_args a = {{AXP_BOUNDARY_KEEP, -1}, NULL, 0, p->rep[0]->K, NULL, NULL};
  return all_parts(p, &a);
}

/* Marks in skip the stages whose agent is lost; AX_ENOTFOUND when one of
 * them is lost in every replica (the same member's). */
static int mark_lost(ax_pipe *p, const char *const *lost, int nlost,
                     unsigned char *skip) {
  int n = p->nrep, S = p->rep[0]->K, T = axi_pipe_members(p);
  for (int i = 0; i < n; i++)
    for (int s = 0; s < S; s++)
      for (int k = 0; k < nlost; k++)
        skip[i * S + s] |= !strcmp(p->rep[i]->agents[s], lost[k]);
  for (int i = 0; i < n; i++)
    for (int s = 0; s < S; s++) {
      int live = 0;
      for (int j = i % T; j < n && !live; j += T)
        live = !skip[j * S + s];
      if (!live)
        return ax_seterr(AX_ENOTFOUND,
                         "live recovery: stage %d of member %d is lost in "
                         "all %d replicas",
                         s, i % T, n / T);
    }
  return AX_OK;
}

/* Whether every stage can reach boundary c: its last update is c - 1, or
 * it kept boundary c. */
static int reachable(int N, const unsigned char *skip, const long *last,
                     const long *kept, long c) {
  for (int x = 0; x < N; x++)
    if (!skip[x] && last[x] != c - 1 && !(last[x] == c && kept[x] == c))
      return 0;
  return 1;
}

/* The boundary every stage can reach: `done`, the first mini-batch not
 * reported (so every step's loss is reported once), else the one after
 * the oldest update (the steps in between were applied everywhere but
 * their losses were not reported: the coordinator had not taken the
 * answers when the failure came); else AX_ESTATE. */
static int common_boundary(int N, const unsigned char *skip, const long *last,
                           const long *kept, long done, long *c) {
  long lo = 0, hi = 0;
  int any = 0;
  for (int x = 0; x < N; x++)
    if (!skip[x]) {
      lo = !any || last[x] < lo ? last[x] : lo;
      hi = !any || last[x] > hi ? last[x] : hi;
      any = 1;
    }
  *c = done;
  if (any && !reachable(N, skip, last, kept, *c))
    *c = lo + 1;
  if (!any || !reachable(N, skip, last, kept, *c))
    return ax_seterr(AX_ESTATE,
                     "live recovery: the stages' last updates are %ld to "
                     "%ld and their kept boundaries meet neither mini-batch "
                     "%ld nor %ld",
                     lo, hi, done, lo + 1);
  return AX_OK;
}

int ax_pipe_live_snapshot(ax_pipe *p, const char *const *lost, int nlost,
                          long done, ax_mem_ckpt *live) {
  AX_TRY(ax_pipe_live_check(p));
  int N = p->nrep * p->rep[0]->K;
  unsigned char *skip = calloc((size_t)N, 1);
  long *last = calloc((size_t)N, sizeof *last),
       *kept = calloc((size_t)N, sizeof *kept);
  int err = skip && last && kept ? AX_OK : AX_ENOMEM;
  if (err == AX_OK)
    err = mark_lost(p, lost, nlost, skip);
  bnd_args a = {{AXP_BOUNDARY_STOP, -1}, skip, 0, p->rep[0]->K, last, kept};
  if (err == AX_OK) /* every survivor stops where it is */
    err = all_parts(p, &a);
  long c = done;
  if (err == AX_OK)
    err = common_boundary(N, skip, last, kept, done, &c);
  a.m = (axi_pipe_boundary_msg){AXP_BOUNDARY_REWIND, c};
  if (err == AX_OK)
    err = all_parts(p, &a);
  ax_ckpt_info info;
  memset(&info, 0, sizeof info);
  info.step = c;
  if (err == AX_OK) /* each survivor's state on its own agent */
    err = axi_pipe_mem_take(p, &info, live, AXI_MEM_GEN_LIVE, 0, skip, live);
  free(skip);
  free(last);
  free(kept);
  return err;
}

int ax_pipe_live_copy(ax_pipe *p, long step, ax_mem_ckpt *live) {
  ax_ckpt_info info;
  memset(&info, 0, sizeof info);
  info.step = step;
  return axi_pipe_mem_take(p, &info, live, AXI_MEM_GEN_LIVE, 0, NULL, live);
}
