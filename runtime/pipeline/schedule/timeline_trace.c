/* A run's trace as a timeline (ax_pipe_timeline_from_trace). Contract in
 * timeline.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/timeline.h"

/* The compute categories, in the order of this table's kinds. */
enum { C_FWD, C_BWD, C_WEIGHT, C_RECOMPUTE, C_OPTIM, C_COUNT };
static const char *const g_cat[C_COUNT] = {"forward", "backward", "weight",
                                           "recompute", "optim"};

typedef struct item {
  int pid, cat;
  long step, micro;
  int64_t t0, t1;
} item;

static int by_unit(const void *a, const void *b) {
  const item *x = a, *y = b;
  if (x->pid != y->pid)
    return x->pid < y->pid ? -1 : 1;
  if (x->step != y->step)
    return x->step < y->step ? -1 : 1;
  if (x->micro != y->micro)
    return x->micro < y->micro ? -1 : 1;
  return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

static int by_rank_start(const void *a, const void *b) {
  const ax_pipe_slot *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* The rank of each of S stages: given, or by the stages' process names. */
static int rank_map(const ax_trace *tr, const int *stage_rank, int S, int *rank,
                    int *ranks) {
  *ranks = 0;
  if (stage_rank) {
    for (int s = 0; s < S; s++) {
      if (stage_rank[s] < 0)
        return ax_seterr(AX_EINVAL, "timeline: stage %d has no rank", s);
      rank[s] = stage_rank[s];
      *ranks = rank[s] + 1 > *ranks ? rank[s] + 1 : *ranks;
    }
    return AX_OK;
  }
  char(*name)[AX_TRACE_NAME_MAX] = calloc((size_t)S, sizeof *name);
  if (!name)
    return ax_seterr(AX_ENOMEM, "timeline: out of memory");
  int same = 1;
  for (int s = 0; s < S; s++) {
    if (ax_trace_get_name(tr, s, -1, name[s], sizeof name[s]) != AX_OK)
      snprintf(name[s], sizeof name[s], "stage %d", s);
    same &= s == 0 || strcmp(name[s], name[0]) == 0;
  }
  for (int s = 0; s < S; s++) {
    int j = 0;
    while (!same && j < s && strcmp(name[j], name[s]) != 0)
      j++;
    rank[s] = !same && j < s ? rank[j] : (*ranks)++;
  }
  ax_clearerr();
  free(name);
  return AX_OK;
}

/* The compute events of mini-batches first..last, as items (*out). */
static int collect(const ax_trace_event *ev, size_t ne, long first, long last,
                   item **out, long *n, int *S) {
  *out = calloc(ne + 1, sizeof **out);
  if (!*out)
    return ax_seterr(AX_ENOMEM, "timeline: out of memory");
  *n = 0;
  *S = 0;
  for (size_t i = 0; i < ne; i++) {
    const ax_trace_event *e = &ev[i];
    int c = 0;
    while (c < C_COUNT && strcmp(e->cat, g_cat[c]) != 0)
      c++;
    if (e->tid != 0 || c == C_COUNT || e->pid < 0 ||
        e->pid >= AX_PIPE_PLAN_MAX_STAGES || e->step < first ||
        (last >= 0 && e->step > last))
      continue;
    (*out)[(*n)++] =
        (item){e->pid,        c,
               (long)e->step, e->micro < 0 || c == C_OPTIM ? 0 : (long)e->micro,
               e->ts_us,      e->ts_us + e->dur_us};
    *S = e->pid + 1 > *S ? e->pid + 1 : *S;
  }
  return *n ? AX_OK
            : ax_seterr(AX_EINVAL, "timeline: the trace has no forward, "
                                   "backward or optimizer step to draw");
}

/* Items (sorted by unit) to slots: a backward is I when its unit has a W
 * on that stage, a recompute moves the start of the backward after it. */
static long to_slots(item *it, long n, const int *rank, ax_pipe_slot *out,
                     int *U) {
  long k = 0;
  int64_t origin = INT64_MAX;
  for (long i = 0; i < n; i++)
    origin = it[i].cat != C_RECOMPUTE && it[i].t0 < origin ? it[i].t0 : origin;
  for (long a = 0, b; a < n; a = b) {
    int has_w = 0;
    for (b = a + 1; b < n && it[b].pid == it[a].pid &&
                    it[b].step == it[a].step && it[b].micro == it[a].micro;
         b++)
      ;
    for (long i = a; i < b; i++)
      has_w |= it[i].cat == C_WEIGHT;
    int64_t replay = -1;
    for (long i = a; i < b; i++) {
      static const int kind[C_COUNT] = {AX_OP_FWD, AX_OP_BWD, AX_OP_WEIGHT_GRAD,
                                        -1, AX_OP_STEP};
      int kd = kind[it[i].cat];
      if (it[i].cat == C_RECOMPUTE) {
        replay = it[i].t0;
        continue;
      }
      int64_t t0 = it[i].t0;
      if (kd == AX_OP_BWD && replay >= 0 && replay < t0) {
        t0 = replay;
        replay = -1;
      }
      if (kd == AX_OP_BWD && has_w)
        kd = AX_OP_INPUT_GRAD;
      ax_pipe_slot *s = &out[k++];
      *s = (ax_pipe_slot){
          .rank = rank[it[i].pid],
          .op = {kd, it[i].pid, (int)it[i].step, (int)it[i].micro, 0},
          .start = (double)(t0 - origin) * 1e-6,
          .end = (double)(it[i].t1 - origin) * 1e-6};
      s->next.kind = -1;
      *U = (int)it[i].micro + 1 > *U ? (int)it[i].micro + 1 : *U;
    }
  }
  return k;
}

int ax_pipe_timeline_from_trace(const ax_trace *tr, const int *stage_rank,
                                int S, long first, long last,
                                ax_pipe_slot **out, long *n, int *ranks,
                                int *U) {
  if (!tr || !out || !n || !ranks || !U || first < 0)
    return ax_seterr(AX_EINVAL, "timeline: bad arguments");
  *out = NULL;
  *n = 0;
  ax_trace_event *ev = NULL;
  size_t ne = 0;
  AX_TRY(ax_trace_events(tr, &ev, &ne));
  item *it = NULL;
  long ni = 0;
  int St = 0, rank[AX_PIPE_PLAN_MAX_STAGES];
  int rc = collect(ev, ne, first, last, &it, &ni, &St);
  free(ev);
  if (rc == AX_OK && stage_rank && S < St)
    rc = ax_seterr(AX_EINVAL,
                   "timeline: the trace has %d stages, the "
                   "placement %d",
                   St, S);
  if (rc == AX_OK)
    rc = rank_map(tr, stage_rank, St, rank, ranks);
  if (rc == AX_OK && !(*out = calloc((size_t)ni, sizeof **out)))
    rc = ax_seterr(AX_ENOMEM, "timeline: out of memory");
  if (rc == AX_OK) {
    qsort(it, (size_t)ni, sizeof *it, by_unit);
    *U = 1;
    *n = to_slots(it, ni, rank, *out, U);
    qsort(*out, (size_t)*n, sizeof **out, by_rank_start);
  }
  free(it);
  return rc;
}
