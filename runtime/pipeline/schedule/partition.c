/* Stash counts per mode, the stage cost model and the split-point dynamic
 * programme (profiling is in profile.c). */
#include "axon/runtime/pipeline/schedule/partition.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "axon/kernels/error.h"

int ax_pipe_stash(const char *mode, int K, int k, int M, int recompute,
                  ax_stash_count *out) {
  int m = ax_pipe_mode_index(mode);
  if (m < 0)
    return AX_EINVAL;
  if (!out || K < 1 || k < 1 || k > K || M < 1)
    return ax_seterr(AX_EINVAL,
                     "stash count: need K >= 1, 1 <= k <= K and M >= 1 "
                     "(got K=%d k=%d M=%d; k is 1-based)",
                     K, k, M);
  if (recompute < AX_RECOMPUTE_NEVER || recompute > AX_RECOMPUTE_EXCEPT_LAST)
    return ax_seterr(AX_EINVAL, "stash count: recompute option %d unknown",
                     recompute);
  return ax_pipe_stash_of(m, M, recompute, ax_pipe_live_bound(m, K, k - 1, M),
                          ax_pipe_version_bound(m, K, k - 1, M), out);
}

int ax_pipe_stash_of(int mode, int M, int recompute, int sets, int versions,
                     ax_stash_count *out) {
  if (!ax_pipe_mode_get(mode))
    return AX_EINVAL;
  if (!out || M < 1 || sets < 0 || versions < 1)
    return ax_seterr(AX_EINVAL,
                     "stash count: need M >= 1, sets >= 0 and versions >= 1 "
                     "(got M=%d sets=%d versions=%d)",
                     M, sets, versions);
  /* Which of the units at the peak keep activations (the rest replay). */
  int U = ax_pipe_units(mode, M), kept = 0, replay = 0;
  for (int u = 0; u < U; u++) {
    int r = ax_pipe_replays(mode, recompute, U, u);
    kept += !r;
    replay |= r;
  }
  ax_stash_count c = {sets,
                      !replay       ? sets
                      : kept < sets ? kept
                                    : sets,
                      versions, replay};
  *out = c;
  return AX_OK;
}

/* The stash count of stage s (0-based): the plan's when given, else the
 * mode's; falls back to sequential's
 * when the options are bad (callers validated them first). */
static ax_stash_count stash_of(const ax_partition_opts *o, int stage) {
  ax_stash_count c = {1, 1, 1, 0};
  if (o->stash && stage >= 0 && stage < o->K)
    return o->stash[stage];
  int M = o->M < 1 ? 1 : o->M;
  if (ax_pipe_stash(o->mode ? o->mode : "sequential", o->K, stage + 1, M,
                    o->recompute, &c) != AX_OK)
    ax_clearerr();
  return c;
}

/* Seconds a stage spends on boundary b's `bytes` (received one way, its
 * gradient sent the other: counted once, as the cost model says), by its
 * link when known. */
static double crossing(const ax_partition_opts *o, int b, double bytes) {
  if (b >= 0 && o->link_Bps && o->link_lat_s && b < o->K - 1 &&
      o->link_Bps[b] > 0)
    return o->link_lat_s[b] + bytes / o->link_Bps[b];
  return o->bandwidth_Bps > 0 ? bytes / o->bandwidth_Bps : 0;
}

double ax_stage_time_at(const ax_block_profile *p, int n, int first, int last,
                        int stage, const ax_partition_opts *o) {
  if (!p || first < 0 || last > n || first >= last || !o)
    return INFINITY;
  ax_stash_count c = stash_of(o, 0);
  double t = 0;
  for (int i = first; i < last; i++)
    t += p[i].fwd_s + p[i].bwd_s + (c.replay ? p[i].fwd_s : 0.0);
  /* the boundary before (activation in, gradient out) and after */
  if (first > 0)
    t += crossing(o, stage - 1, (double)p[first - 1].out_bytes);
  if (last < n)
    t += crossing(o, stage, (double)p[last - 1].out_bytes);
  return t;
}

double ax_stage_time(const ax_block_profile *p, int n, int first, int last,
                     const ax_partition_opts *o) {
  return ax_stage_time_at(p, n, first, last, -1, o); /* -1: no link */
}

size_t ax_stage_memory(const ax_block_profile *p, int n, int first, int last,
                       int stage, const ax_partition_opts *o) {
  if (!p || first < 0 || last > n || first >= last || !o)
    return SIZE_MAX;
  ax_stash_count c = stash_of(o, stage);
  size_t params = 0, buffers = 0, saved = 0;
  for (int i = first; i < last; i++) {
    params += p[i].param_bytes;
    buffers += p[i].buffer_bytes;
    saved += p[i].saved_bytes;
  }
  size_t copies = 1 + (size_t)c.weight_versions +
                  (size_t)(o->optim_copies > 0 ? o->optim_copies : 0);
  return params * copies + buffers + saved * (size_t)c.activation_sets +
         p[first].in_bytes * (size_t)(c.sets - c.activation_sets) +
         saved * (size_t)c.replay;
}

/* dp[s][j]: the best objective for blocks [0, j) in s stages; cut[s][j] the
 * start of the last stage. by_memory selects the objective (max stage
 * memory, ignoring the cap) used to explain an infeasible cap. */
#define NB (AX_MODEL_MAX_BLOCKS + 1)

static double solve(const ax_block_profile *p, int n,
                    const ax_partition_opts *o, int by_memory, int *bounds) {
  static const double inf = INFINITY;
  double dp[NB][NB];
  int cut[NB][NB];
  int K = o->K;
  for (int s = 0; s <= K; s++)
    for (int j = 0; j <= n; j++)
      dp[s][j] = inf, cut[s][j] = -1;
  dp[0][0] = 0;
  for (int s = 1; s <= K; s++)
    for (int j = s; j <= n - (K - s); j++)
      for (int i = s - 1; i < j; i++) {
        if (dp[s - 1][i] == inf)
          continue;
        size_t mem = ax_stage_memory(p, n, i, j, s - 1, o);
        double cost;
        if (by_memory) {
          cost = (double)mem;
        } else {
          if (o->mem_cap && mem > o->mem_cap)
            continue;
          cost = ax_stage_time_at(p, n, i, j, s - 1, o);
        }
        double v = dp[s - 1][i] > cost ? dp[s - 1][i] : cost;
        if (v < dp[s][j])
          dp[s][j] = v, cut[s][j] = i;
      }
  if (dp[K][n] == inf)
    return inf;
  bounds[K] = n;
  for (int s = K; s >= 1; s--)
    bounds[s - 1] = cut[s][bounds[s]];
  return dp[K][n];
}

static int check_opts(const ax_block_profile *p, int n,
                      const ax_partition_opts *o, const int *bounds) {
  if (!p || !o || !bounds)
    return ax_seterr(AX_EINVAL, "partition: NULL argument");
  if (n < 1 || n > AX_MODEL_MAX_BLOCKS)
    return ax_seterr(AX_EINVAL, "partition: %d blocks outside [1, %d]", n,
                     AX_MODEL_MAX_BLOCKS);
  if (o->K < 1 || o->K > n)
    return ax_seterr(AX_EINVAL,
                     "partition: cannot split %d blocks into %d stages "
                     "(need 1 <= K <= %d)",
                     n, o->K, n);
  ax_stash_count c;
  return ax_pipe_stash(o->mode ? o->mode : "sequential", o->K, 1,
                       o->M < 1 ? 1 : o->M, o->recompute, &c);
}

static void fill_report(const ax_block_profile *p, int n,
                        const ax_partition_opts *o, const int *bounds,
                        ax_partition_report *rep) {
  if (!rep)
    return;
  memset(rep, 0, sizeof *rep);
  rep->K = o->K;
  for (int s = 0; s < o->K; s++) {
    rep->stage_time[s] = ax_stage_time_at(p, n, bounds[s], bounds[s + 1], s, o);
    rep->stage_mem[s] = ax_stage_memory(p, n, bounds[s], bounds[s + 1], s, o);
    if (rep->stage_time[s] > rep->max_time)
      rep->max_time = rep->stage_time[s];
  }
}

int ax_partition_balanced(const ax_block_profile *p, int n,
                          const ax_partition_opts *o, int *bounds,
                          ax_partition_report *rep) {
  AX_TRY(check_opts(p, n, o, bounds));
  int tmp[NB];
  if (solve(p, n, o, 0, tmp) == INFINITY) {
    double least = solve(p, n, o, 1, tmp);
    return ax_seterr(AX_EINVAL,
                     "partition: no split of %d blocks into %d stages fits "
                     "the memory cap of %.2f MiB per stage in mode %s "
                     "(the best split needs %.2f MiB on its largest stage)",
                     n, o->K, (double)o->mem_cap / 1048576.0,
                     o->mode ? o->mode : "sequential", least / 1048576.0);
  }
  memcpy(bounds, tmp, sizeof(int) * (size_t)(o->K + 1));
  fill_report(p, n, o, bounds, rep);
  return AX_OK;
}

int ax_partition_uniform(int n, int K, int *bounds) {
  if (!bounds)
    return ax_seterr(AX_EINVAL, "partition: NULL bounds");
  return ax_split_uniform(n, K, bounds);
}

int ax_partition_model(const char *how, const ax_model_def *def,
                       const ax_config *cfg, ax_device dev,
                       const ax_tlist *input, const ax_profile_opts *prof,
                       const ax_partition_opts *o, int *bounds,
                       ax_partition_report *rep) {
  if (!how || !def || !cfg || !o || !bounds)
    return ax_seterr(AX_EINVAL, "partition: NULL argument");
  if (strcmp(how, "uniform") == 0) {
    ax_model_info info;
    AX_TRY(ax_model_describe(def, cfg, &info));
    AX_TRY(ax_partition_uniform(info.n_blocks, o->K, bounds));
    if (rep) {
      memset(rep, 0, sizeof *rep);
      rep->K = o->K;
    }
    return AX_OK;
  }
  if (strcmp(how, "balanced") != 0)
    return ax_seterr(AX_EINVAL,
                     "partition: unknown method '%s' (valid: uniform, "
                     "balanced)",
                     how);
  ax_block_profile p[AX_MODEL_MAX_BLOCKS];
  int n = 0;
  AX_TRY(ax_profile_blocks(def, cfg, dev, input, prof, p, &n));
  return ax_partition_balanced(p, n, o, bounds, rep);
}

char *ax_partition_format(const int *bounds, int K, char *buf, size_t len) {
  if (!buf || len == 0)
    return buf;
  buf[0] = '\0';
  if (!bounds || K < 1)
    return buf;
  size_t used = 0;
  for (int s = 0; s <= K; s++) {
    int w = snprintf(buf + used, len - used, s ? "/%d" : "%d", bounds[s]);
    if (w < 0 || (size_t)w >= len - used) {
      buf[0] = '\0';
      return buf;
    }
    used += (size_t)w;
  }
  return buf;
}
