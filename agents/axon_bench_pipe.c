/* axon-bench pipe: the runtime's own overhead in every pipeline mode,
 * measured on synthetic stages whose forward and backward take a fixed time.
 *
 *   axon-bench pipe [--stages K] [--micro M] [--fwd-ms F] [--bwd-ms B]
 *                   [--w-ms W] [--repeat R] [--modes a,b,..]
 *                   [--agent-threads N] [--batch N] [--ahead a,b,..]
 *
 * K local agents (axon-agent next to this binary, forked and exec'ed before
 * gRPC starts here; default K = 4) host the stages of the "sleep" model
 * (models/sleep.c): per agent and unit a forward takes F ms and a backward
 * B ms, of which the weight half takes W (defaults 20, 40, B / 2); a
 * chunked mode's v stages per agent take 1/v of that each. For every mode
 * of the table (or --modes) the coordinator trains a fixed number of
 * mini-batches; the time per mini-batch in steady state is the spacing of
 * the mini-batch completions after a warm-up: (done[n-1] - done[w-1]) /
 * (n - w). It is printed next to the timing model (ax_formula_time_split:
 * a simulation of the mode's own action lists), with their ratio (goal:
 * within 1.05), and the bubble fraction both imply (1 - one agent's
 * compute per mini-batch / time per mini-batch), and the idle fraction
 * measured ("idle_m": 1 - the compute the stages reported per agent and
 * mini-batch / time per mini-batch: the bubble without the compute's own
 * inflation, e.g. a sleep's wake-up latency). Each mode runs --repeat
 * times (default 3) and the medians are printed.
 *
 * The last columns break the overhead down from the coordinator's events:
 * "issue" is the mean time from the moment an operation could start (its
 * stage finished its previous operation and its dependencies completed) to
 * the moment the coordinator issued it; "rpc" is the mean of (reply time -
 * issue time - the compute time the stage reported), i.e. the round trip of
 * the call itself; "in_stage" is the mean of (the compute time the stage
 * reported, which leaves out its wait for activations or gradients, less
 * the nominal sleep), i.e. the copies, the push of the outputs and the
 * timer slack. "issue" and "rpc" are shown for --ahead 1 only: an action
 * issued ahead waits on its agent, so its call's times bound nothing. For
 * flushed modes the warm-up is one mini-batch; for the others K + 1
 * mini-batches, and the last K - 1 (the drain, faster than the steady state)
 * are not measured.
 *
 * --ahead lists the values of ax_pipe_opts.ahead to compare (default: 0,
 * the library's default, stage-driven; 1 is coordinator-driven): each mode
 * runs every value in turn, repeat by repeat, so the rows compare within
 * one run. The last lines give each value's bubble of zb-h1 and zbv as a
 * fraction of 1f1b's (goals: <= 1/2 and <= 1/4), dualpipev's against its
 * formula, (K - 1)(F&B + B - 3W) with per-stage times and F&B = F + B
 * (goal: within 0.02), and the activations v-half and v-min keep against
 * 1f1b's (goals: <= 0.55 and <= 0.40). "act" is the most activations an
 * agent keeps at once, the sum over its stages of the live units each
 * reported after its last action, over v: in units of one micro-batch
 * through an agent's layers, K for 1f1b. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agents/axon_bench_local.h"
#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/coord/train.h"
#include "axon/runtime/pipeline/schedule/formula.h"

#define MAXR 16

typedef struct bp_args {
  int K, M, repeat, agent_threads, batch;
  double fwd_ms, bwd_ms, w_ms; /* per agent; w_ms: the weight half of bwd */
  const char *modes;           /* NULL: every mode of the table */
  int ahead[4], n_ahead;       /* ax_pipe_opts.ahead values compared */
} bp_args;

typedef struct bp_run { /* one training run of one mode */
  const bp_args *a;
  double done[64];
  long steps;
} bp_run;

/* ---- one run ------------------------------------------------------------- */
static int bp_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  const bp_args *a = ((const bp_run *)user)->a;
  int64_t xs[2] = {a->batch, 16}, ys[1] = {a->batch};
  ax_tensor *x = ax_tensor_new(AX_F32, 2, xs, AX_CPU);
  ax_tensor *y = ax_tensor_new(AX_I32, 1, ys, AX_CPU);
  if (!x || !y) {
    ax_tensor_release(x);
    ax_tensor_release(y);
    return AX_ENOMEM;
  }
  for (int64_t i = 0; i < a->batch * 16; i++)
    ax_f32(x)[i] = (float)((i * 7 + t) % 13) / 13.0f;
  for (int64_t i = 0; i < a->batch; i++)
    ax_i32(y)[i] = (int32_t)((i + t) % 10);
  in->t[0] = x, in->n = 1;
  lab->t[0] = y, lab->n = 1;
  return AX_OK;
}

static void bp_step(void *user, const ax_pipe_step_info *s) {
  bp_run *r = user;
  if (r->steps < 64)
    r->done[r->steps] = s->seconds;
  r->steps++;
}

/* Mean issue latency and mean call overhead of the run's operations (ms). */
static void overheads(ax_pipe *p, const bp_args *a, int mode,
                      const ax_pipe_plan *plan, double *issue, double *rpc,
                      double *stage) {
  long n;
  int M = a->M, v = ax_pipe_stages(p) / a->K;
  const ax_pipe_event *ev = ax_pipe_events(p, &n);
  double si = 0, sr = 0, ss = 0;
  long ni = 0;
  for (long i = 0; i < n; i++) {
    const ax_pipe_event *e = &ev[i];
    double ready = 0;
    /* A copy of the event's action, not the plan's: its own part's
     * dependencies (a composite's partner is not next to it here). */
    ax_pipe_op deps[AX_PIPE_MAX_STAGES + 2], own = e->op;
    own.with_next = 0;
    int nd = ax_pipe_plan_deps(plan, &own, deps);
    for (long j = 0; j < n; j++) {
      const ax_pipe_event *f = &ev[j];
      /* its agent's previous action (agents hold several stages in the
       * chunked modes) */
      int dep = ax_pipe_stage_rank(mode, a->K, f->op.stage) ==
                    ax_pipe_stage_rank(mode, a->K, e->op.stage) &&
                f->t_done <= e->t_issue;
      for (int k = 0; !dep && k < nd; k++) /* a STEP rides on its B */
        dep = f->op.kind ==
                  (deps[k].kind == AX_OP_STEP ? AX_OP_BWD : deps[k].kind) &&
              f->op.stage == deps[k].stage && f->op.batch == deps[k].batch &&
              f->op.micro == deps[k].micro;
      if (dep && f->t_done > ready)
        ready = f->t_done;
    }
    if (ready > 0) {
      si += e->t_issue - ready;
      ni++;
    }
    sr += e->t_done - e->t_issue - e->busy_s;
    int replay = ax_pipe_replays(mode, AX_RECOMPUTE_NEVER,
                                 ax_pipe_units(mode, M), e->op.micro);
    double f = a->fwd_ms / v, b = a->bwd_ms / v, w = a->w_ms / v;
    double nominal = e->op.kind == AX_OP_FWD          ? f
                     : e->op.kind == AX_OP_INPUT_GRAD ? b - w + (replay ? f : 0)
                     : e->op.kind == AX_OP_WEIGHT_GRAD ? w
                                                       : b + (replay ? f : 0);
    ss += e->busy_s - 1e-3 * nominal;
  }
  *issue = ni ? 1e3 * si / (double)ni : 0;
  *rpc = n ? 1e3 * sr / (double)n : 0;
  *stage = n ? 1e3 * ss / (double)n : 0;
}

/* The mean over agents of the compute the stages reported for mini-batches
 * [lo, hi], per mini-batch (seconds). */
static double busy_per_batch(ax_pipe *p, const bp_args *a, int mode, long lo,
                             long hi) {
  long n = 0;
  const ax_pipe_event *ev = ax_pipe_events(p, &n);
  double sum = 0;
  for (long i = 0; i < n; i++)
    if (ev[i].op.batch >= lo && ev[i].op.batch <= hi)
      sum += ev[i].busy_s;
  return sum / a->K / (double)(hi - lo + 1);
}

/* An agent's peak of kept activations (see the top): its actions' events
 * in its list's order (its driver books them in turn), each with the live
 * units its stage reported after it. */
static double peak_act(ax_pipe *p, const bp_args *a, int mode, int v) {
  long n = 0;
  const ax_pipe_event *ev = ax_pipe_events(p, &n);
  int live[AX_PIPE_MAX_STAGES] = {0};
  double most = 0;
  for (int r = 0; r < a->K; r++) {
    int sum = 0;
    for (long i = 0; i < n; i++) {
      int s = ev[i].op.stage;
      if (ax_pipe_stage_rank(mode, a->K, s) != r)
        continue;
      sum += ev[i].live - live[s];
      live[s] = ev[i].live;
      most = (double)sum / v > most ? (double)sum / v : most;
    }
  }
  return most;
}

static int run_mode(ax_node *node, const bp_args *a, const char *const *ag,
                    int mode, int ahead, double *per_batch, double *busy,
                    double *issue, double *rpc, double *stage, double *act) {
  /* Chunked modes split each agent's work into v stages of 1/v the time. */
  int v = ax_pipe_chunks(mode, 0);
  char cfg[160];
  snprintf(cfg, sizeof cfg,
           "blocks=%d,fwd_ms=%g,bwd_ms=%g,w_ms=%g,"
           "width=16,classes=10",
           a->K * v, a->fwd_ms / v, a->bwd_ms / v, a->w_ms / v);
  ax_pipe_opts o = {"sleep",
                    cfg,
                    a->K,
                    ag,
                    NULL,
                    mode,
                    a->M,
                    AX_RECOMPUTE_NEVER,
                    "opt=sgd,lr=0.01",
                    1,
                    AX_CPU,
                    30000,
                    NULL,
                    v};
  o.ahead = ahead;
  int flushed = ax_pipe_flushes(mode);
  /* Modes without a flush drain at the end (the last K - 1 mini-batches
   * finish faster than the steady state): measure before the drain. */
  long warm = flushed ? 1 : a->K + 1;
  long n = flushed ? warm + 4 : warm + 12 + a->K - 1;
  long last = flushed ? n - 1 : n - a->K;
  ax_pipe *p = NULL;
  ax_pipe_plan *plan = NULL;
  AX_TRY(ax_pipe_plan_new(mode, a->K, v, a->M, n, &plan));
  int err = ax_pipe_new(node, &o, &p);
  bp_run r = {a, {0}, 0};
  if (err == AX_OK)
    err = ax_pipe_train(p, n, bp_batch, bp_step, &r);
  if (err == AX_OK && r.steps != n)
    err = ax_seterr(AX_ESTATE, "%ld of %ld mini-batches reported", r.steps, n);
  if (err == AX_OK) {
    *per_batch = (r.done[last] - r.done[warm - 1]) / (double)(last - warm + 1);
    *busy = busy_per_batch(p, a, mode, warm, last);
    overheads(p, a, mode, plan, issue, rpc, stage);
    *act = peak_act(p, a, mode, v);
  }
  ax_pipe_free(p);
  ax_pipe_plan_free(plan);
  return err;
}

/* ---- command line and table ---------------------------------------------- */
static int parse(int argc, char **argv, bp_args *a) {
  static const struct option lo[] = {
      {"stages", 1, 0, 'K'}, {"micro", 1, 0, 'M'},
      {"fwd-ms", 1, 0, 'f'}, {"bwd-ms", 1, 0, 'b'},
      {"w-ms", 1, 0, 'w'},   {"repeat", 1, 0, 'r'},
      {"modes", 1, 0, 'm'},  {"agent-threads", 1, 0, 't'},
      {"batch", 1, 0, 'B'},  {"ahead", 1, 0, 'a'},
      {"help", 0, 0, 'h'},   {0, 0, 0, 0}};
  *a = (bp_args){4, 8, 3, 4, 16, 20, 40, -1, NULL, {0}, 1};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'K':
      a->K = atoi(optarg);
      break;
    case 'M':
      a->M = atoi(optarg);
      break;
    case 'f':
      a->fwd_ms = atof(optarg);
      break;
    case 'b':
      a->bwd_ms = atof(optarg);
      break;
    case 'w':
      a->w_ms = atof(optarg);
      break;
    case 'r':
      a->repeat = atoi(optarg);
      break;
    case 'm':
      a->modes = optarg;
      break;
    case 't':
      a->agent_threads = atoi(optarg);
      break;
    case 'B':
      a->batch = atoi(optarg);
      break;
    case 'a': {
      a->n_ahead = 0;
      char *end = optarg;
      while (*end && a->n_ahead < 4) {
        a->ahead[a->n_ahead++] = (int)strtol(end, &end, 10);
        end += *end == ',';
      }
      break;
    }
    case 'h':
      printf("usage: axon-bench pipe [--stages K] [--micro M] [--fwd-ms F] "
             "[--bwd-ms B] [--w-ms W] [--repeat R] [--modes a,b,..] "
             "[--agent-threads N] [--batch N] [--ahead a,b,..]\n");
      return 1;
    default:
      return 2;
    }
  }
  if (a->w_ms < 0)
    a->w_ms = a->bwd_ms / 2; /* the split modes' weight half */
  if (a->K < 1 || a->K > AX_PIPE_MAX_STAGES || a->M < 1 || a->repeat < 1 ||
      a->repeat > MAXR || a->batch < a->M || a->w_ms > a->bwd_ms ||
      2 * a->K > AX_PIPE_MAX_STAGES || a->n_ahead < 1 || a->ahead[0] < 0 ||
      a->ahead[a->n_ahead - 1] < 0) {
    fprintf(stderr,
            "axon-bench pipe: need 1 <= K <= %d, M >= 1, batch >= M,"
            " 0 <= w-ms <= bwd-ms, 1 <= repeat <= %d\n",
            AX_PIPE_MAX_STAGES / 2, MAXR);
    return 2;
  }
  return 0;
}

static int bench(ax_node *node, const bp_args *a, const char *const *ag) {
  printf("# axon-bench pipe: K=%d agents, M=%d, per agent and unit t_f=%g "
         "t_b=%g ms (weight half %g), sleep model, batch %d, median of %d "
         "runs\n",
         a->K, a->M, a->fwd_ms, a->bwd_ms, a->w_ms, a->batch, a->repeat);
  printf("%-11s %5s %11s %12s %7s %10s %10s %8s %9s %7s %9s %5s\n", "mode",
         "ahead", "formula_ms", "measured_ms", "ratio", "bubble_f", "bubble_m",
         "idle_m", "issue_ms", "rpc_ms", "in_stage", "act");
  char list[256];
  snprintf(list, sizeof list, "%s", a->modes ? a->modes : ax_pipe_mode_list());
  for (char *c = list; *c; c++)
    *c = *c == '|' ? ',' : *c;
  int worst = 0;
  /* The measured bubbles of 1f1b, zb-h1 and zbv per ahead value (< 0: not
   * run), for the goals. */
  double bub[3][4] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}};
  double idl[3][4] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}};
  /* dualpipev's measured bubble; the activations of 1f1b, v-half, v-min */
  double dpv[4] = {-1, -1, -1, -1}, act[3] = {-1, -1, -1};
  for (char *sv = NULL, *m = strtok_r(list, ",", &sv); m;
       m = strtok_r(NULL, ",", &sv)) {
    int mode = ax_pipe_mode_index(m);
    if (mode < 0)
      return AX_EINVAL;
    int v = ax_pipe_chunks(mode, 0), S = a->K * v;
    double tf[AX_PIPE_MAX_STAGES], ti[AX_PIPE_MAX_STAGES],
        tw[AX_PIPE_MAX_STAGES];
    for (int s = 0; s < S; s++) /* per stage: 1/v of an agent's work */
      tf[s] = a->fwd_ms * 1e-3 / v, ti[s] = (a->bwd_ms - a->w_ms) * 1e-3 / v,
      tw[s] = a->w_ms * 1e-3 / v;
    double f = 0, t[4][MAXR], is[4][MAXR], rp[4][MAXR], st[4][MAXR],
           bz[4][MAXR], ac = 0;
    AX_TRY(ax_formula_time_split(m, a->K, v, a->M, tf, ti, tw,
                                 AX_RECOMPUTE_NEVER, &f));
    for (int r = 0; r < a->repeat; r++) /* interleaved: value by value */
      for (int k = 0; k < a->n_ahead; k++)
        AX_TRY(run_mode(node, a, ag, mode, a->ahead[k], &t[k][r], &bz[k][r],
                        &is[k][r], &rp[k][r], &st[k][r], &ac));
    /* One agent's compute per mini-batch (a replay adds a forward). */
    int U = ax_pipe_units(mode, a->M);
    double work =
        1e-3 * U *
        (a->fwd_ms * (1 + ax_pipe_replays(mode, 0, U, 0)) + a->bwd_ms);
    int g = !strcmp(m, "1f1b")    ? 0
            : !strcmp(m, "zb-h1") ? 1
            : !strcmp(m, "zbv")   ? 2
                                  : -1,
        h = !strcmp(m, "1f1b")     ? 0
            : !strcmp(m, "v-half") ? 1
            : !strcmp(m, "v-min")  ? 2
                                   : -1;
    if (h >= 0)
      act[h] = ac;
    for (int k = 0; k < a->n_ahead; k++) {
      double mt = axi_bench_median(t[k], a->repeat), ratio = mt / f;
      double idle[MAXR]; /* per run: 1 - measured compute / time */
      for (int r = 0; r < a->repeat; r++)
        idle[r] = 1 - bz[k][r] / t[k][r];
      double bm = axi_bench_median(idle, a->repeat);
      printf("%-11s %5d %11.1f %12.1f %7.3f %10.3f %10.3f %8.3f", m,
             a->ahead[k] ? a->ahead[k] : AX_PIPE_AHEAD, 1e3 * f, 1e3 * mt,
             ratio, 1 - work / f, 1 - work / mt, bm);
      if (a->ahead[k] == 1)
        printf(" %9.3f %7.3f", axi_bench_median(is[k], a->repeat),
               axi_bench_median(rp[k], a->repeat));
      else /* issued ahead: the call's times do not bound the action */
        printf(" %9s %7s", "-", "-");
      printf(" %9.3f %5.1f\n", axi_bench_median(st[k], a->repeat), ac);
      if (mode == AX_MODE_DUALPIPEV)
        dpv[k] = 1 - work / mt;
      if (g >= 0) {
        bub[g][k] = 1 - work / mt;
        idl[g][k] = bm;
      }
      worst |= ratio > 1.05 || ratio < 0.95;
    }
    fflush(stdout);
  }
  for (int k = 0; k < a->n_ahead; k++)
    if (bub[0][k] > 0 && (bub[1][k] >= 0 || bub[2][k] >= 0))
      printf("# ahead %d: bubble of zb-h1 / 1f1b %.3f (goal <= 0.5), zbv / "
             "1f1b %.3f (goal <= 0.25); by idle time %.3f and %.3f\n",
             a->ahead[k] ? a->ahead[k] : AX_PIPE_AHEAD,
             bub[1][k] >= 0 ? bub[1][k] / bub[0][k] : -1,
             bub[2][k] >= 0 ? bub[2][k] / bub[0][k] : -1,
             idl[1][k] >= 0 ? idl[1][k] / idl[0][k] : -1,
             idl[2][k] >= 0 ? idl[2][k] / idl[0][k] : -1);
  /* DualPipe's README: (PP / 2 - 1)(F&B + B - 3W), PP = 2K stages of half
   * an agent's times each */
  double hf = a->fwd_ms / 2, hb = a->bwd_ms / 2, hw = a->w_ms / 2,
         gap = (a->K - 1) * (hf + hb + hb - 3 * hw),
         work = 2.0 * a->M * (hf + hb);
  for (int k = 0; k < a->n_ahead; k++)
    if (dpv[k] >= 0)
      printf("# ahead %d: bubble of dualpipev %.3f, its formula's %.3f "
             "(goal: within 0.02)\n",
             a->ahead[k] ? a->ahead[k] : AX_PIPE_AHEAD, dpv[k],
             gap / (work + gap));
  if (act[0] > 0 && (act[1] >= 0 || act[2] >= 0))
    printf("# activations per agent against 1f1b's: v-half %.3f (goal <= "
           "0.55), v-min %.3f (goal <= 0.40)\n",
           act[1] / act[0], act[2] / act[0]);
  printf("# goal: every ratio within [0.95, 1.05]: %s\n",
         worst ? "NOT MET" : "met");
  return AX_OK;
}

int ax_bench_pipe_main(int argc, char **argv) {
  bp_args a;
  int rc = parse(argc, argv, &a);
  if (rc)
    return rc == 1 ? 0 : rc;
  char names[AX_PIPE_MAX_STAGES][32];
  const char *ag[AX_PIPE_MAX_STAGES];
  pid_t pids[AX_PIPE_MAX_STAGES] = {0};
  int port = ax_local_free_port();
  if (port < 0) {
    fprintf(stderr, "axon-bench pipe: no free port\n");
    return 1;
  }
  char th[16];
  snprintf(th, sizeof th, "%d", a.agent_threads);
  const char *args[] = {"--threads", th, "--peer-timeout-ms", "3000", NULL};
  for (int s = 0; s < a.K; s++) {
    snprintf(names[s], sizeof names[s], "agent%d", s);
    ag[s] = names[s];
    pids[s] =
        axi_bench_spawn_agent(names[s], port, "AXON_THREADS", "1", 0, args);
  }
  ax_node *node = NULL;
  rc = axi_bench_master("coordinator", port, a.K + 1, &node);
  if (rc == AX_OK)
    rc = bench(node, &a, ag);
  if (rc != AX_OK)
    fprintf(stderr, "axon-bench pipe: %s: %s\n", ax_strerror(rc), ax_errmsg());
  if (node) { /* the agents leave when told to; signals as the fallback */
    ax_local_end_world(node, a.K, pids, 10000, NULL, "axon-bench pipe");
    ax_node_shutdown(node, 5000);
    ax_dist_fini(node);
    ax_node_destroy(node);
  }
  ax_local_stop(a.K, pids, 10000, NULL);
  return rc == AX_OK ? 0 : 1;
}
