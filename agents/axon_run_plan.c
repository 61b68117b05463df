/* axon-run plan: the FlexFlow-style search of seed 001, limited to
 * pipeline modes, splits and the given micro-batch count. For every mode of
 * the table and every split (uniform, and balanced: the partitioner's
 * slowest stage with its transfers), predicts seconds per mini-batch with
 * the timing model (ax_formula_time_comm: the mode's own action lists, each
 * block's measured forward and backward time on this host, and the
 * transfers between stages over the links that `axon-run probe --out`
 * measured: one-way latency = half the small call's round trip, bytes at
 * the link's rate), plus the peak memory of every stage (the partitioner's
 * model: parameters, weight versions, optimizer state, kept activations),
 * and picks the fastest under --mem-cap.
 *
 * The coordinator is taken to run on the first agent's host: its actions
 * reach the others over that agent's links, --ahead (8) outstanding per
 * agent, so a flushed mode's next mini-batch waits for the answers.
 *
 * What it does not see: other processes on the same cores (agents of one
 * host share them), and the coordinator's own costs; --action-us adds a
 * fixed cost to every forward and backward (the call or push that starts
 * it). Blocks are profiled here, with one compute thread, so the agents
 * are assumed to compute as fast as one core of this host; --compute-scale
 * X multiplies every block's time (agents sharing cores: the test bed's 4
 * hosts on 2 cores compute at half speed when all are busy, X = 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stddef.h>

#include "agents/axon_run.h"
#include "axon/kernels/clock.h"
#include "axon/models/data/dataset.h"
#include "axon/models/optim.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include <time.h>

#define MAXL 4096

typedef struct link_row {
  char from[64], to[64];
  double rtt_us, gbit;
} link_row;

typedef struct links {
  link_row *row;
  int n;
} links;

static int read_links(const char *path, links *L) {
  L->row = NULL;
  L->n = 0;
  if (!path)
    return AX_OK;
  FILE *f = fopen(path, "r");
  if (!f)
    return ax_seterr(AX_EIO, "plan: cannot read %s", path);
  L->row = calloc(MAXL, sizeof *L->row);
  char line[512];
  int rc = L->row ? AX_OK : AX_ENOMEM, ln = 0;
  while (rc == AX_OK && fgets(line, sizeof line, f)) {
    ln++;
    if (line[0] == '#' || line[0] == '\n')
      continue;
    link_row *r = &L->row[L->n];
    if (L->n == MAXL ||
        sscanf(line, "%63s %63s %lf %lf", r->from, r->to, &r->rtt_us,
               &r->gbit) != 4 ||
        !(r->rtt_us >= 0) || !(r->gbit > 0))
      rc = ax_seterr(AX_EINVAL,
                     "plan: %s line %d: want 'FROM TO RTT_US "
                     "GBIT_S' (axon-run probe --out)",
                     path, ln);
    else
      L->n++;
  }
  fclose(f);
  if (rc != AX_OK) {
    free(L->row);
    L->row = NULL;
    L->n = 0;
  }
  return rc;
}

/* The link from agent a to b: one-way seconds and bytes/s (0, 0: same
 * agent or unknown; unknown pairs are an error the caller reports). */
static const link_row *find_link(const links *L, const char *a, const char *b) {
  for (int i = 0; i < L->n; i++)
    if (!strcmp(L->row[i].from, a) && !strcmp(L->row[i].to, b))
      return &L->row[i];
  return NULL;
}

static int link_of(const links *L, const char *a, const char *b, double *lat_s,
                   double *Bps) {
  *lat_s = 0;
  *Bps = 0;
  if (!L->n || !strcmp(a, b))
    return AX_OK;
  const link_row *r = find_link(L, a, b);
  if (!r)
    return ax_seterr(AX_EINVAL, "plan: the links file has no %s -> %s", a, b);
  *lat_s = r->rtt_us * 0.5e-6;
  *Bps = r->gbit * 1e9 / 8;
  return AX_OK;
}

/* The links between mode m's neighbouring stages (S stages, on a->agents
 * in the mode's placement): stage s to s + 1 (lat, Bps) and back (back_lat,
 * back_Bps), each S - 1 entries; all 0 without a links file or on one
 * agent. */
static int boundary_links(const links *L, const axi_run_pipe_args *a, int m,
                          int S, double *lat, double *Bps, double *back_lat,
                          double *back_Bps) {
  for (int s = 0; s + 1 < S; s++) {
    const char *x = a->agents[ax_pipe_stage_rank(m, a->K, s)],
               *y = a->agents[ax_pipe_stage_rank(m, a->K, s + 1)];
    AX_TRY(link_of(L, x, y, &lat[s], &Bps[s]));
    AX_TRY(link_of(L, y, x, &back_lat[s], &back_Bps[s]));
  }
  return AX_OK;
}

/* Seconds per parameter of one optimizer step (--optim) and of copying
 * one (a stashed weight version), timed on 1M parameters here. */
static int update_costs(const char *optim, double *step_s, double *copy_s) {
  enum { N = 1 << 20, REPS = 9 };
  ax_config c;
  ax_optim_cfg oc;
  AX_TRY(ax_config_parse(&c, optim));
  AX_TRY(ax_optim_cfg_parse(&c, &oc));
  int64_t n = N;
  ax_tensor *w = ax_tensor_new(AX_F32, 1, &n, AX_CPU),
            *g = ax_tensor_new(AX_F32, 1, &n, AX_CPU),
            *d = ax_tensor_new(AX_F32, 1, &n, AX_CPU);
  ax_optim *o = ax_optim_new(&oc, N, AX_CPU);
  int rc = w && g && d && o ? AX_OK : AX_ENOMEM;
  double best_step = 1e9, best_copy = 1e9;
  if (rc == AX_OK) {
    memset(w->data, 0, N * 4);
    memset(g->data, 0, N * 4);
  }
  for (int r = 0; rc == AX_OK && r < REPS; r++) {
    double t0 = ax_clock_s();
    rc = ax_optim_step(o, w, g);
    double t1 = ax_clock_s();
    memcpy(d->data, w->data, N * 4);
    double t2 = ax_clock_s();
    if (r) /* the first warms up */
      best_step = t1 - t0 < best_step ? t1 - t0 : best_step,
      best_copy = t2 - t1 < best_copy ? t2 - t1 : best_copy;
  }
  ax_optim_free(o);
  ax_tensor_release(w);
  ax_tensor_release(g);
  ax_tensor_release(d);
  *step_s = best_step / N;
  *copy_s = best_copy / N;
  return rc;
}

typedef struct plan_row {
  int mode, balanced, S, bounds[AX_PIPE_MAX_STAGES + 1];
  double spb;  /* predicted seconds per mini-batch */
  size_t peak; /* the largest agent's bytes */
} plan_row;

/* Predicts one mode and split; step_s and copy_s: update_costs. */
static int predict(const axi_run_pipe_args *a, const links *L, int m,
                   int balanced, const ax_block_profile *p, int n,
                   double step_s, double copy_s, plan_row *row) {
  const ax_pipe_mode_def *md = ax_pipe_mode_get(m);
  int K = a->K, v = ax_pipe_chunks(m, a->chunks), S = K * v;
  int U = ax_pipe_units(m, a->M);
  if (S > n || S > AX_PIPE_MAX_STAGES || U < ax_pipe_min_units(m, K) ||
      (md->chunked && md->placement == AX_PLACE_LOOP && U % K))
    return AX_EUNSUPPORTED; /* not possible with this model or M */
  double lat[AX_PIPE_MAX_STAGES], bw[AX_PIPE_MAX_STAGES],
      back_lat[AX_PIPE_MAX_STAGES], back_bw[AX_PIPE_MAX_STAGES];
  AX_TRY(boundary_links(L, a, m, S, lat, bw, back_lat, back_bw));
  /* the cap is per agent: its v stages share it */
  ax_partition_opts po = {S,
                          md->name,
                          a->M,
                          a->recompute,
                          0,
                          (size_t)(a->plan_mem_cap / v),
                          axi_run_optim_copies(a->optim),
                          L->n ? lat : NULL,
                          L->n ? bw : NULL};
  row->mode = m;
  row->balanced = balanced;
  row->S = S;
  if (balanced)
    AX_TRY(ax_partition_balanced(p, n, &po, row->bounds, NULL));
  else
    AX_TRY(ax_split_uniform(n, S, row->bounds));
  double tf[AX_PIPE_MAX_STAGES], tb[AX_PIPE_MAX_STAGES], tw[AX_PIPE_MAX_STAGES],
      fwd[AX_PIPE_MAX_STAGES], bwd[AX_PIPE_MAX_STAGES],
      step[AX_PIPE_MAX_STAGES], fbusy[AX_PIPE_MAX_STAGES],
      bbusy[AX_PIPE_MAX_STAGES];
  size_t mem[AX_PIPE_MAX_STAGES] = {0};
  double scale = a->plan_compute_scale > 0 ? a->plan_compute_scale : 1;
  for (int s = 0; s < S; s++) {
    double params = 0;
    tf[s] = tb[s] = 0;
    for (int i = row->bounds[s]; i < row->bounds[s + 1]; i++) {
      tf[s] += scale * p[i].fwd_s, tb[s] += scale * p[i].bwd_s;
      params += (double)p[i].param_bytes / 4;
    }
    /* the optimizer's step, and a weight version stashed per mini-batch
     * (spread over its units' forwards) where the mode keeps several */
    step[s] = scale * step_s * params;
    if (ax_pipe_version_bound(m, K, s, a->M) > 1)
      tf[s] += scale * copy_s * params / U;
    /* split modes: the halves taken as equal (axon-bench split measures
     * them per block) */
    tw[s] = md->split ? tb[s] / 2 : 0;
    tb[s] -= tw[s];
    mem[ax_pipe_stage_rank(m, K, s)] +=
        ax_stage_memory(p, n, row->bounds[s], row->bounds[s + 1], s, &po);
    if (s + 1 < S) { /* a link carries one tensor at a time, then its
                        latency */
      double bytes = (double)p[row->bounds[s + 1] - 1].out_bytes;
      fbusy[s] = bw[s] > 0 ? bytes / bw[s] : 0;
      bbusy[s] = back_bw[s] > 0 ? bytes / back_bw[s] : 0;
      fwd[s] = lat[s];
      bwd[s] = back_lat[s];
    }
  }
  row->peak = 0;
  for (int r = 0; r < K; r++)
    row->peak = mem[r] > row->peak ? mem[r] : row->peak;
  /* the coordinator runs next to the first agent: its actions reach rank
   * r over the first agent's link to it, `ahead` outstanding at a time */
  double issue[AX_PIPE_MAX_STAGES];
  for (int r = 0; r < K; r++) {
    double l, b;
    AX_TRY(link_of(L, a->agents[0], a->agents[r], &l, &b));
    issue[r] = 2 * l;
  }
  ax_formula_comm c = {fwd,
                       bwd,
                       a->plan_action_us * 1e-6,
                       step,
                       L->n ? issue : NULL,
                       a->ahead > 0 ? a->ahead : 8,
                       fbusy,
                       bbusy};
  return ax_formula_time_comm(md->name, K, v, a->M, tf, tb,
                              md->split ? tw : NULL, a->recompute, &c,
                              &row->spb);
}

int axi_run_stage_links(const axi_run_pipe_args *a, int m, double *lat_s,
                        double *Bps, int *have) {
  links L;
  *have = 0;
  if (a->K * ax_pipe_chunks(m, a->chunks) > AX_PIPE_MAX_STAGES)
    return ax_seterr(AX_EINVAL, "--links: at most %d stages",
                     AX_PIPE_MAX_STAGES);
  AX_TRY(read_links(a->plan_links, &L));
  double back_lat[AX_PIPE_MAX_STAGES], back_Bps[AX_PIPE_MAX_STAGES];
  int rc = boundary_links(&L, a, m, a->K * ax_pipe_chunks(m, a->chunks), lat_s,
                          Bps, back_lat, back_Bps);
  *have = L.n > 0 && rc == AX_OK;
  free(L.row);
  return rc;
}

static int wanted(const char *modes, const char *name) {
  if (!modes || !strcmp(modes, "all"))
    return 1;
  size_t k = strlen(name);
  for (const char *s = modes; (s = strstr(s, name)); s += k)
    if ((s == modes || s[-1] == ',') && (s[k] == ',' || !s[k]))
      return 1;
  return 0;
}

/* Every name of --modes is a mode of the table. */
static int modes_known(const char *modes) {
  if (!modes || !strcmp(modes, "all"))
    return AX_OK;
  for (const char *s = modes; *s;) {
    size_t k = strcspn(s, ",");
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(k < 63 ? k : 63), s);
    if (ax_pipe_mode_index(name) < 0)
      return ax_seterr(AX_EINVAL, "plan: --modes names '%s', not a mode", name);
    s += k + (s[k] == ',');
  }
  return AX_OK;
}

int axi_run_plan(const axi_run_pipe_args *a) {
  const ax_model_def *def = ax_model_find(a->model);
  if (!def)
    return ax_seterr(AX_ENOTFOUND, "plan: no model %s", a->model);
  AX_TRY(modes_known(a->plan_modes));
  ax_config dcfg, mcfg;
  AX_TRY(ax_config_parse(&dcfg, a->data_config));
  AX_TRY(ax_model_config(def, a->model_config, &mcfg));
  links L;
  AX_TRY(read_links(a->plan_links, &L));
  ax_dataset *ds = NULL;
  int rc = ax_dataset_open(a->dataset, &dcfg, AX_SPLIT_TRAIN, &ds);
  /* profiles per unit: a mini-batch, and a micro-batch of batch / M */
  static ax_block_profile pmini[AX_MODEL_MAX_BLOCKS],
      pmicro[AX_MODEL_MAX_BLOCKS];
  int n = 0;
  if (rc == AX_OK)
    rc = axi_run_profile(a, def, &mcfg, ds, a->batch, 5, pmini, &n);
  if (rc == AX_OK && a->M > 1)
    rc = axi_run_profile(a, def, &mcfg, ds, (a->batch + a->M - 1) / a->M, 5,
                         pmicro, &n);
  ax_dataset_close(ds);
  double step_s = 0, copy_s = 0;
  if (rc == AX_OK)
    rc = update_costs(a->optim, &step_s, &copy_s);
  plan_row best = {.mode = -1};
  if (rc == AX_OK) {
    printf("axon-run plan: %s, batch %d, %d micro-batches, %d agents (%s), "
           "links %s, %d blocks; action cost %.0f us, compute x %.2f\n",
           a->model, a->batch, a->M, a->K, a->agents[0],
           a->plan_links ? a->plan_links : "none", n, a->plan_action_us,
           a->plan_compute_scale > 0 ? a->plan_compute_scale : 1.0);
    printf("  %-12s %-9s %-24s %12s %12s %14s\n", "mode", "split", "blocks",
           "ms/step", "samples/s", "peak MiB/agent");
  }
  for (int m = 0; rc == AX_OK && m < AX_MODE_COUNT; m++) {
    if (!wanted(a->plan_modes, ax_pipe_mode_name(m)))
      continue;
    const ax_block_profile *p = ax_pipe_units(m, a->M) > 1 ? pmicro : pmini;
    for (int bal = 0; bal < 2 && rc == AX_OK; bal++) {
      plan_row row;
      int r = predict(a, &L, m, bal, p, n, step_s, copy_s, &row);
      if (r == AX_EUNSUPPORTED || (r == AX_EINVAL && bal && a->plan_mem_cap)) {
        ax_clearerr(); /* too few blocks, units, or no split fits the cap */
        continue;
      }
      if ((rc = r) != AX_OK)
        break;
      char sb[256];
      int fits = !a->plan_mem_cap || row.peak <= (size_t)a->plan_mem_cap;
      printf("  %-12s %-9s %-24s %12.2f %12.1f %14.1f%s\n",
             ax_pipe_mode_name(m), bal ? "balanced" : "uniform",
             ax_partition_format(row.bounds, row.S, sb, sizeof sb),
             1e3 * row.spb, a->batch / row.spb, row.peak / 1048576.0,
             fits ? "" : "  over the cap");
      if (fits && (best.mode < 0 || row.spb < best.spb))
        best = row;
    }
  }
  free(L.row);
  if (rc != AX_OK)
    return rc;
  if (best.mode < 0)
    return ax_seterr(AX_EINVAL,
                     "plan: no mode and split fits %lld bytes per "
                     "agent",
                     (long long)a->plan_mem_cap);
  char sb[256];
  printf("plan: mode=%s partition=%s blocks=%s predicted_ms_per_step=%.2f "
         "predicted_samples_per_s=%.1f peak_mib=%.1f\n",
         ax_pipe_mode_name(best.mode), best.balanced ? "balanced" : "uniform",
         ax_partition_format(best.bounds, best.S, sb, sizeof sb),
         1e3 * best.spb, a->batch / best.spb, best.peak / 1048576.0);
  return AX_OK;
}

/* The stages come from --stages K; --agents only names them for the
 * links file (stage0.. without it). */
static int plan_main(int argc, char **argv) {
  static axi_run_cli r;
  static const char *names[AX_PIPE_MAX_STAGES];
  static char buf[AX_PIPE_MAX_STAGES][16];
  int rc = axi_run_cli_parse(&axi_run_plan_cmd, argc, argv, &r);
  if (rc >= 0)
    return rc;
  axi_run_pipe_args *pa = &r.pa;
  if (pa->K < 1 || pa->local || pa->emulate) {
    fprintf(stderr, "axon-run plan: needs --stages K (and --agents A,B,... "
                    "to read their links)\n");
    return 2;
  }
  for (int s = 0; !pa->agents && s < pa->K; s++) {
    snprintf(buf[s], sizeof buf[s], "stage%d", s);
    names[s] = buf[s];
  }
  if (!pa->agents)
    pa->agents = names;
  if (pa->nagents && pa->nagents != pa->K) {
    fprintf(stderr, "axon-run plan: --agents names one agent per stage\n");
    return 2;
  }
  axi_run_cli_to_pipe(&r);
  if ((rc = axi_run_plan(pa)) != AX_OK)
    fprintf(stderr, "axon-run plan: %s\n", ax_errmsg());
  return rc == AX_OK ? 0 : 1;
}

#define F(field) offsetof(axi_run_cli, field)

static const axi_cli_opt g_plan_opts[] = {
    {"modes", "all|M,..", AXI_CLI_STR, F(pa.plan_modes),
     .help = "the modes predicted (all)"},
    {"action-us", "US", AXI_CLI_DOUBLE, F(pa.plan_action_us), 0, INT64_MAX,
     .help = "a fixed cost added to every forward and backward (0)"},
    {"compute-scale", "X", AXI_CLI_DOUBLE, F(pa.plan_compute_scale), 0,
     INT64_MAX, AXI_CLI_OPEN_LO,
     .help = "multiplies every block's measured time (1)"},
    AXI_CLI_END};

static const axi_cli_opt *const g_plan_tables[] = {g_plan_opts, NULL};

const axi_cli_cmd axi_run_plan_cmd = {
    "plan",
    "--stages K [--agents A,B,...] [--links FILE]\n"
    "[--modes all|M,..] [--mem-cap BYTES] [--action-us US]\n"
    "[--compute-scale X] [train's options]",
    "Every mode and split (uniform, balanced) predicted with the timing "
    "model\nover the links of FILE (axon-run probe --out): ms/step, "
    "samples/s, peak\nmemory per agent; picks the fastest under the cap.",
    g_plan_tables,
    &axi_run_train_cmd,
    0,
    plan_main};
