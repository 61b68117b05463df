/* What axon-run's commands share about a run's blocks and memory: the
 * blocks profiled in this process (plan's times and bytes, the fit's
 * bytes), the split of train's stages, and the fit of a run's plan under
 * --mem-cap (the verifier's check 4, verify.h), which train runs before
 * any agent is contacted and schedule runs from the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/models/data/dataset.h"
#include "axon/models/optim.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include "axon/runtime/pipeline/schedule/sched_text.h"

int axi_run_optim_copies(const char *cfg) {
  ax_config c;
  ax_optim_cfg o;
  if (ax_config_parse(&c, cfg) != AX_OK || ax_optim_cfg_parse(&c, &o) != AX_OK)
    return 2; /* the optimizer's own parse reports the bad configuration */
  return o.kind == AX_OPT_ADAMW ? 2 : o.momentum != 0 ? 1 : 0;
}

int axi_run_profile(const axi_run_pipe_args *a, const ax_model_def *def,
                    const ax_config *mcfg, ax_dataset *ds, int rows, int reps,
                    ax_block_profile *p, int *n) {
  ax_loader *ld = NULL;
  AX_TRY(ax_loader_new(ds, rows, 0, 1, a->seed, &ld));
  ax_tlist in = {0}, lab = {0};
  ax_loader_start(ld, 0);
  int rc = ax_loader_next(ld, &in, &lab);
  ax_profile_opts po = {reps > 1, reps, a->seed, a->precision};
  if (rc == AX_OK)
    rc = ax_profile_blocks(def, mcfg, AX_CPU, &in, &po, p, n);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_loader_free(ld);
  return rc;
}

int axi_run_split(const axi_run_pipe_args *a, const ax_model_def *def,
                  const ax_config *mcfg, ax_loader *ld, int n_blocks,
                  int *bounds) {
  if (a->split_set) { /* chosen already, by the fit before the agents */
    memcpy(bounds, a->split, sizeof(int) * (size_t)(axi_run_stages(a) + 1));
    return AX_OK;
  }
  if (!a->partition || strcmp(a->partition, "balanced"))
    return ax_split_uniform(n_blocks, axi_run_stages(a), bounds);
  ax_tlist in = {0}, lab = {0};
  ax_loader_start(ld, 0);
  int rc = ax_loader_next(ld, &in, &lab);
  ax_partition_opts po = {axi_run_stages(a),
                          ax_pipe_mode_name(a->mode),
                          a->M,
                          a->recompute,
                          0,
                          0,
                          0,
                          NULL,
                          NULL};
  /* --links: each boundary weighed by its link (axon-run probe --out) */
  double lat[AX_PIPE_MAX_STAGES], bw[AX_PIPE_MAX_STAGES];
  int have = 0;
  if (rc == AX_OK && a->plan_links)
    rc = axi_run_stage_links(a, a->mode, lat, bw, &have);
  if (have)
    po.link_lat_s = lat, po.link_Bps = bw;
  ax_partition_report rep;
  if (rc == AX_OK)
    rc = ax_partition_model("balanced", def, mcfg, AX_CPU, &in,
                            &(ax_profile_opts){1, 3, 1, a->precision}, &po,
                            bounds, &rep);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  return rc;
}

/* The model, its configuration and the training data of run a. */
typedef struct fit_run {
  const ax_model_def *def;
  ax_config mcfg;
  ax_dataset *ds;
  int n_blocks;
} fit_run;

static int open_run(const axi_run_pipe_args *a, fit_run *f) {
  ax_config dcfg;
  ax_model_info info;
  memset(f, 0, sizeof *f);
  if (!(f->def = ax_model_find(a->model)))
    return ax_seterr(AX_ENOTFOUND, "no model %s", a->model);
  AX_TRY(ax_config_parse(&dcfg, a->data_config));
  AX_TRY(ax_model_config(f->def, a->model_config, &f->mcfg));
  AX_TRY(ax_model_describe(f->def, &f->mcfg, &info));
  f->n_blocks = info.n_blocks;
  return ax_dataset_open(a->dataset, &dcfg, AX_SPLIT_TRAIN, &f->ds);
}

/* Plan p's fit for run a, its stages starting at bounds: the blocks' bytes
 * for one unit (a replica's rows of a mini-batch over the plan's units),
 * summed per stage, verified against a->plan_mem_cap per rank. */
static int fit_plan(const axi_run_pipe_args *a, fit_run *f,
                    const ax_pipe_plan *p, const int *bounds,
                    ax_pipe_verify_report *r) {
  static ax_block_profile blocks[AX_MODEL_MAX_BLOCKS];
  ax_block_profile st[AX_PIPE_PLAN_MAX_STAGES];
  int S = ax_pipe_plan_stages(p), U = ax_pipe_plan_units(p), n = 0;
  int R = a->replicas > 1 ? a->replicas : 1;
  int rows = (a->batch / R + U - 1) / U;
  AX_TRY(axi_run_profile(a, f->def, &f->mcfg, f->ds, rows > 0 ? rows : 1, 1,
                         blocks, &n));
  memset(st, 0, sizeof st);
  for (int s = 0; s < S; s++) {
    st[s].in_bytes = blocks[bounds[s]].in_bytes;
    st[s].out_bytes = blocks[bounds[s + 1] - 1].out_bytes;
    for (int i = bounds[s]; i < bounds[s + 1]; i++) {
      st[s].param_bytes += blocks[i].param_bytes;
      st[s].buffer_bytes += blocks[i].buffer_bytes;
      st[s].saved_bytes += blocks[i].saved_bytes;
    }
  }
  ax_pipe_verify_opts o = {.stage_bytes = st,
                           .mem_cap = (size_t)a->plan_mem_cap,
                           .optim_copies = axi_run_optim_copies(a->optim),
                           .recompute = a->recompute};
  return ax_pipe_verify(p, &o, r);
}

int axi_run_fit(const axi_run_pipe_args *a, const ax_pipe_plan *p,
                ax_pipe_verify_report *r) {
  fit_run f;
  int bounds[AX_PIPE_PLAN_MAX_STAGES + 1], S = ax_pipe_plan_stages(p);
  int rc = open_run(a, &f);
  if (rc == AX_OK && S > f.n_blocks)
    rc = ax_seterr(AX_EINVAL, "%d stages for %d blocks", S, f.n_blocks);
  if (rc == AX_OK)
    rc = ax_split_uniform(f.n_blocks, S, bounds);
  if (rc == AX_OK)
    rc = fit_plan(a, &f, p, bounds, r);
  ax_dataset_close(f.ds);
  return rc;
}

void axi_run_fit_print(FILE *out, const char *what,
                       const ax_pipe_verify_report *r, int64_t cap) {
  fprintf(out,
          "%sfits the cap of %lld bytes per agent; peak bytes per rank:", what,
          (long long)cap);
  for (int k = 0; k < r->ranks; k++)
    fprintf(out, " %zu", r->rank_mem[k]);
  fprintf(out, "\n");
}

/* The plan train runs: the schedule file's, or the mode's (two mini-batches
 * show the steady state of the modes that do not flush). */
static int run_plan(const axi_run_pipe_args *a, ax_pipe_plan **p) {
  if (a->schedule)
    return ax_pipe_sched_plan(a->schedule, 2, p);
  return ax_pipe_plan_new(a->mode, a->K, a->chunks, a->M, 2, p);
}

int axi_run_fit_train(axi_run_pipe_args *a) {
  if (!a->plan_mem_cap || a->probe || a->gen)
    return AX_OK;
  fit_run f;
  ax_loader *ld = NULL;
  ax_pipe_plan *p = NULL;
  ax_pipe_verify_report r = {0};
  int rc = open_run(a, &f), S = axi_run_stages(a);
  if (rc == AX_OK && S > f.n_blocks)
    rc = ax_seterr(AX_EINVAL, "%d stages for %d blocks", S, f.n_blocks);
  if (rc == AX_OK) /* the loader of the run's batches, as run() makes it */
    rc = ax_loader_new(f.ds, a->batch, 1, 1, a->seed, &ld);
  if (rc == AX_OK)
    rc = axi_run_split(a, f.def, &f.mcfg, ld, f.n_blocks, a->split);
  if (rc == AX_OK)
    rc = run_plan(a, &p);
  if (rc == AX_OK)
    rc = fit_plan(a, &f, p, a->split, &r);
  if (rc == AX_OK) {
    a->split_set = 1; /* the run uses the split the fit checked */
    axi_run_fit_print(stderr, "axon-run: --mem-cap: the run ", &r,
                      a->plan_mem_cap);
  } else {
    const char *why = r.text ? r.text : ax_errmsg();
    fprintf(stderr, "axon-run: --mem-cap: %s%s", why,
            why[0] && why[strlen(why) - 1] == '\n' ? "" : "\n");
  }
  ax_pipe_verify_report_clear(&r);
  ax_pipe_plan_free(p);
  ax_loader_free(ld);
  ax_dataset_close(f.ds);
  return rc;
}
