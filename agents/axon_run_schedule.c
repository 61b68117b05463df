/* axon-run schedule: a mode's action lists as text (one rank per line), or
 * a schedule file checked by the verifier and printed again, normalised
 * (runtime/pipeline/schedule/sched_text.h, verify.h; docs/MODES.md,
 * "Schedules as data"); either one's simulated timeline, or a run's trace,
 * drawn as a text grid and a PNG (axon_run_schedule_view.h); and what
 * train's --schedule FILE needs checked before any agent starts. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_run.h"
#include "agents/axon_run_schedule_view.h"
#include "axon/runtime/pipeline/schedule/sched_text.h"
#include "axon/runtime/pipeline/schedule/verify.h"
#include "axon/runtime/pipeline/trace/trace.h"

#define MAXS AX_PIPE_PLAN_MAX_STAGES

/* What schedule's options fill. */
typedef struct sched_cli {
  int mode, K, M, chunks, recompute;
  const char *file, *check, *out, *trace;
  long batches, skip;
  double tf[MAXS], tb[MAXS], tw[MAXS];
  int ntf, ntb, ntw;
  axi_run_view_opts o;
  ax_train_opts t; /* --mem-cap's model, data, batch and optimizer */
  int64_t mem_cap;
} sched_cli;

static int set_mode(void *dst, const char *s) {
  sched_cli *u = dst;
  if ((u->mode = ax_pipe_mode_index(s)) >= 0)
    return 0;
  fprintf(stderr, "axon-run: %s\n", ax_errmsg());
  return 2;
}

/* "X" or "X,Y,...": one cost for every stage, or one per stage. */
static int costs(const char *arg, double *a, int *n) {
  char *end;
  for (*n = 0; *n < MAXS; (*n)++) {
    a[*n] = strtod(arg, &end);
    if (end == arg || !(a[*n] >= 0) || (*end && *end != ',')) {
      fprintf(stderr, "axon-run: costs: want X or X,Y,... (>= 0): %s\n", arg);
      return 2;
    }
    if (!*end) {
      (*n)++;
      return 0;
    }
    arg = end + 1;
  }
  fprintf(stderr, "axon-run: costs: at most %d stages\n", MAXS);
  return 2;
}

static int set_tf(void *d, const char *a) {
  sched_cli *c = d;
  return costs(a, c->tf, &c->ntf);
}
static int set_tb(void *d, const char *a) {
  sched_cli *c = d;
  return costs(a, c->tb, &c->ntb);
}
static int set_tw(void *d, const char *a) {
  sched_cli *c = d;
  return costs(a, c->tw, &c->ntw);
}

static int fail(int rc) {
  fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
  return 1;
}

/* A run's trace drawn (--trace): its ranks from --mode and --stages when
 * given. */
static int view_trace(sched_cli *c) {
  ax_trace *tr = NULL;
  if (ax_trace_read(c->trace, &tr) != AX_OK)
    return fail(AX_EFORMAT);
  int map[MAXS], S = 0;
  if (c->mode >= 0 && c->K > 0) { /* the mode's placement */
    S = c->K * ax_pipe_chunks(c->mode, c->chunks);
    for (int i = 0; i < S && i < MAXS; i++)
      map[i] = ax_pipe_stage_rank(c->mode, c->K, i);
  }
  ax_pipe_slot *s = NULL;
  long n = 0;
  int ranks = 0, U = 1;
  int rc = ax_pipe_timeline_from_trace(
      tr, S ? map : NULL, S, c->skip,
      c->batches ? c->skip + c->batches - 1 : -1, &s, &n, &ranks, &U);
  ax_trace_free(tr);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-run: %s: %s\n", c->trace, ax_errmsg());
    return 1;
  }
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "trace %s: %d ranks, %ld actions", c->trace,
           ranks, n);
  c->o.unit = "s";
  if (!c->o.grid && !c->o.plot)
    c->o.grid = 1;
  rc = axi_run_view_slots(s, n, ranks, U, what, &c->o);
  free(s);
  return rc;
}

/* A cost list given for S stages: one value for all, or S. */
static const double *per_stage(double *a, int n, int S, double *scalar) {
  if (n == 1)
    *scalar = a[0];
  return n == S ? a : NULL;
}

/* The simulated timeline of plan drawn with c's costs. */
static int view_plan(sched_cli *c, const ax_pipe_plan *plan) {
  int S = ax_pipe_plan_stages(plan);
  for (int i = 0; i < 3; i++) {
    int got = i == 0 ? c->ntf : i == 1 ? c->ntb : c->ntw;
    if (got > 1 && got != S) {
      fprintf(stderr, "axon-run: %d costs for %d stages\n", got, S);
      return 2;
    }
  }
  c->o.t_f = per_stage(c->tf, c->ntf, S, &c->o.f);
  c->o.t_b = per_stage(c->tb, c->ntb, S, &c->o.b);
  c->o.t_w = per_stage(c->tw, c->ntw, S, &c->o.w);
  c->o.recompute = c->recompute;
  return axi_run_schedule_view(plan, &c->o);
}

/* The verifier's counts of a plan that passed (--check). */
static void print_counts(const char *name, const ax_pipe_plan *p,
                         const ax_pipe_verify_report *r) {
  printf("%s: verified: %d ranks, %d stages, %d units per mini-batch, no "
         "deadlock (%ld steps)\n",
         name, ax_pipe_plan_ranks(p), r->stages, ax_pipe_plan_units(p),
         r->steps);
  printf("peak live units per stage:");
  for (int i = 0; i < r->stages; i++)
    printf(" %d", r->peak_live[i]);
  printf("\nweight versions per stage:");
  for (int i = 0; i < r->stages; i++)
    printf(" %d", r->peak_versions[i]);
  printf("\n");
}

/* --mem-cap: plan p's fit for the model of u's options (axi_run_fit, the
 * stages split uniformly), its counts and the bytes per rank printed, or
 * the verifier's refusal. */
static int fit_main(const sched_cli *u, const char *name,
                    const ax_pipe_plan *p) {
  const ax_train_opts *t = &u->t;
  axi_run_pipe_args a = {.model = t->model,
                         .model_config = t->model_config,
                         .dataset = t->dataset,
                         .data_config = t->data_config,
                         .optim = t->optim_config,
                         .batch = t->batch,
                         .seed = t->seed,
                         .recompute = u->recompute,
                         .plan_mem_cap = u->mem_cap};
  if (axi_run_check_configs(t) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 2;
  }
  ax_pipe_verify_report r = {0};
  int rc = axi_run_fit(&a, p, &r);
  if (rc == AX_OK) {
    print_counts(name, p, &r);
    axi_run_fit_print(stdout, "", &r, u->mem_cap);
  } else {
    const char *why = r.text ? r.text : ax_errmsg();
    fprintf(stderr, "axon-run: %s: %s%s", name, why,
            strchr(why, '\n') ? "" : "\n");
  }
  ax_pipe_verify_report_clear(&r);
  return rc == AX_OK ? 0 : 1;
}

/* The text of u's mode: its first mini-batch when it flushes, else K + 1
 * mini-batches to view (sched_text.h). */
static int mode_text(const sched_cli *u, char **out) {
  ax_pipe_plan *p = NULL;
  long n = ax_pipe_flushes(u->mode) ? 1 : u->K + 1;
  AX_TRY(ax_pipe_plan_new(u->mode, u->K, u->chunks, u->M, n, &p));
  int rc = ax_pipe_plan_text(p, out);
  ax_pipe_plan_free(p);
  return rc;
}

static int write_text(const char *path, char *text) {
  FILE *f = path ? fopen(path, "w") : stdout;
  int bad = !f || fputs(text, f) < 0;
  if (f && f != stdout)
    bad |= fclose(f) != 0;
  free(text);
  if (bad) {
    fprintf(stderr, "axon-run: cannot write %s\n", path ? path : "stdout");
    return 1;
  }
  return 0;
}

/* The plan drawn: one flushed mini-batch, or enough units for a steady
 * state; --batches chooses. */
static long view_batches(const sched_cli *u, int flushes, int U) {
  if (u->batches > 0)
    return u->batches;
  if (flushes)
    return 1;
  long n = (3L * u->K + U - 1) / U;
  return n > 2 ? n : 2;
}

/* A file (--file, --check): loaded, verified (the full report on a
 * refusal), then printed, counted or drawn. */
static int file_main(sched_cli *u) {
  const char *path = u->check ? u->check : u->file;
  ax_pipe_sched *s = NULL;
  if (ax_pipe_sched_load(path, &s) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 1;
  }
  ax_pipe_verify_report r = {0};
  ax_pipe_plan *p = NULL;
  int rc = 0;
  if (ax_pipe_sched_verify(s, &r) != AX_OK) {
    fprintf(stderr, "axon-run: %s: %s\n", path, r.text ? r.text : ax_errmsg());
    rc = 1;
  } else if (u->check && u->mem_cap) { /* the fit of two mini-batches */
    rc = ax_pipe_sched_plan(s, 2, &p) == AX_OK ? fit_main(u, path, p)
                                               : fail(AX_EINVAL);
  } else if (u->o.grid || u->o.plot || u->check) {
    if (ax_pipe_sched_plan(s, view_batches(u, 1, 1), &p) != AX_OK)
      rc = fail(AX_EINVAL);
    else if (u->o.grid || u->o.plot)
      rc = view_plan(u, p);
    else
      print_counts(path, p, &r);
  } else {
    char *text = NULL;
    rc = ax_pipe_sched_text(s, &text) == AX_OK ? write_text(u->out, text)
                                               : fail(AX_ENOMEM);
  }
  ax_pipe_plan_free(p);
  ax_pipe_verify_report_clear(&r);
  ax_pipe_sched_free(s);
  return rc;
}

/* A built-in mode (--mode): its lists as text, or drawn. */
static int mode_main(sched_cli *u) {
  if (u->mem_cap) { /* its fit over two mini-batches (what train checks) */
    ax_pipe_plan *p = NULL;
    int rc = ax_pipe_plan_new(u->mode, u->K, u->chunks, u->M, 2, &p);
    if (rc != AX_OK)
      return fail(rc);
    rc = fit_main(u, ax_pipe_mode_name(u->mode), p);
    ax_pipe_plan_free(p);
    return rc;
  }
  if (!u->o.grid && !u->o.plot) {
    char *text = NULL;
    int rc = mode_text(u, &text);
    return rc == AX_OK ? write_text(u->out, text) : fail(rc);
  }
  ax_pipe_plan *p = NULL;
  long n =
      view_batches(u, ax_pipe_flushes(u->mode), ax_pipe_units(u->mode, u->M));
  int rc = ax_pipe_plan_new(u->mode, u->K, u->chunks, u->M, n, &p);
  if (rc != AX_OK)
    return fail(rc);
  rc = view_plan(u, p);
  ax_pipe_plan_free(p);
  return rc;
}

static int schedule_main(int argc, char **argv) {
  sched_cli u = {.mode = -1,
                 .M = 4,
                 .o = {.f = 1, .b = 1, .w = 1},
                 .t = ax_train_defaults()};
  int rc =
      axi_cli_parse(&axi_run_prog, &axi_run_schedule_cmd, 2, argc, argv, &u);
  if (rc >= 0)
    return rc;
  if (u.trace)
    return view_trace(&u);
  int sources = (u.mode >= 0) + (u.file != NULL) + (u.check != NULL);
  if (u.mem_cap && (u.file || u.o.grid || u.o.plot)) {
    fprintf(stderr, "axon-run: schedule --mem-cap goes with --check FILE "
                    "or --mode M --stages K, without --grid or --plot\n");
    return 2;
  }
  if (sources != 1 || (u.mode >= 0 && u.K < 1)) {
    fprintf(stderr, "axon-run: schedule needs one of --mode M --stages K, "
                    "--file FILE, --check FILE or --trace FILE (try "
                    "--help)\n");
    return 2;
  }
  return u.mode >= 0 ? mode_main(&u) : file_main(&u);
}

/* Why --schedule cannot run with pa (written into buf), or NULL. */
static const char *conflict(const axi_run_pipe_args *pa, const ax_pipe_sched *s,
                            char *buf, size_t len) {
  int parts = AXR_PARTS(pa), K = pa->local ? pa->local / parts : pa->K;
  int m = ax_pipe_sched_mode(s);
  if (pa->mode_set && pa->mode != m)
    snprintf(buf, len,
             "--mode %s contradicts the schedule, whose stages follow %s "
             "(its mode line, or by default zb-h1 with I or W, else 1f1b)",
             ax_pipe_mode_name(pa->mode), ax_pipe_mode_name(m));
  else if (pa->micro_set && ax_pipe_units(m, pa->M) != ax_pipe_sched_units(s))
    snprintf(buf, len, "--microbatches %d contradicts the schedule's micro %d",
             pa->M, ax_pipe_sched_units(s));
  else if (K != ax_pipe_sched_ranks(s))
    snprintf(buf, len,
             "the schedule has %d ranks, the run %d agents per "
             "pipeline",
             ax_pipe_sched_ranks(s), K);
  else if (pa->chunks)
    snprintf(buf, len,
             "--chunks with --schedule: the schedule places its "
             "stages");
  else if (pa->freeze_schedule)
    snprintf(buf, len,
             "--freeze-schedule re-splits the stages, which the "
             "schedule fixes");
  else if (strcmp(pa->partition, "uniform"))
    snprintf(buf, len,
             "--partition %s with --schedule: the schedule's "
             "stages are split uniformly",
             pa->partition);
  else
    return NULL;
  return buf;
}

int axi_run_cli_schedule(axi_run_cli *r) {
  axi_run_pipe_args *pa = &r->pa;
  if (!pa->schedule_file)
    return -1;
  ax_pipe_sched *s = NULL;
  if (ax_pipe_sched_load(pa->schedule_file, &s) != AX_OK) {
    fprintf(stderr, "axon-run: --schedule: %s\n", ax_errmsg());
    return 2;
  }
  ax_pipe_verify_report rep = {0};
  if (ax_pipe_sched_verify(s, &rep) != AX_OK) {
    fprintf(stderr, "axon-run: --schedule %s: %s\n", pa->schedule_file,
            rep.text ? rep.text : ax_errmsg());
    ax_pipe_verify_report_clear(&rep);
    ax_pipe_sched_free(s);
    return 2;
  }
  if (pa->emulate && pa->K < 1) /* no agents: the schedule's ranks */
    pa->K = ax_pipe_sched_ranks(s);
  char why[400];
  if (conflict(pa, s, why, sizeof why)) {
    fprintf(stderr, "axon-run: %s (%s)\n", why, pa->schedule_file);
    ax_pipe_sched_free(s);
    return 2;
  }
  pa->mode = ax_pipe_sched_mode(s);
  pa->M = ax_pipe_sched_units(s);
  pa->schedule = s; /* the process's until it exits */
  return -1;
}

#define F(field) offsetof(sched_cli, field)
static const axi_cli_opt g_sched_opts[] = {
    {"mode", "MODE", AXI_CLI_FN, .values_fn = ax_pipe_mode_list, .fn = set_mode,
     .help = "%s: print or draw its lists"},
    {"stages", "K", AXI_CLI_INT, F(K), 1, AX_PIPE_PLAN_MAX_STAGES,
     .help = "with --mode: its ranks (agents)"},
    {"micro", "M", AXI_CLI_INT, F(M), 1, AX_PIPE_SCHED_MAX_UNITS,
     .help = "with --mode: micro-batches per mini-batch (4)"},
    {"chunks", "V", AXI_CLI_INT, F(chunks), 0, AX_PIPE_PLAN_MAX_STAGES,
     .help = "with --mode: stages per agent of a chunked mode (2)"},
    {"file", "FILE", AXI_CLI_STR, F(file),
     .help = "a schedule file: verified, printed normalised"},
    {"check", "FILE", AXI_CLI_STR, F(check),
     .help = "a schedule file verified: its peak live units\n"
             "and weight versions per stage, or why it would hang"},
    {"out", "FILE", AXI_CLI_STR, F(out),
     .help = "write the text there (default stdout)"},
    {"grid", NULL, AXI_CLI_FLAG, F(o.grid),
     .help = "draw the timing model's timeline as a text grid"},
    {"plot", "FILE.png", AXI_CLI_STR, F(o.plot),
     .help = "draw it as a PNG with gnuplot"},
    {"trace", "FILE", AXI_CLI_STR, F(trace),
     .help = "draw a run's trace (--trace of axon-run train);\n"
             "--mode and --stages give the ranks of its stages"},
    {"batches", "N", AXI_CLI_LONG, F(batches), 0, 1 << 20,
     .help = "mini-batches drawn (a flushed mode 1, others\n"
             "enough for 3 K units; a trace: all)"},
    {"skip", "N", AXI_CLI_LONG, F(skip), 0, LONG_MAX,
     .help = "a trace: its first N mini-batches not drawn (0)"},
    {"t-f", "X[,..]", AXI_CLI_FN, .fn = set_tf,
     .help = "a forward's cost, every stage's or each (1)"},
    {"t-b", "X[,..]", AXI_CLI_FN, .fn = set_tb,
     .help = "a backward's input half (I) (1)"},
    {"t-w", "X[,..]", AXI_CLI_FN, .fn = set_tw,
     .help = "its weight half (W) (1); B costs both"},
    {"t-step", "X", AXI_CLI_DOUBLE, F(o.step), 0, INT64_MAX,
     .help = "an optimizer step's cost (0: not drawn)"},
    {"recompute", "0|1|2", AXI_CLI_INT, F(recompute), 0, 2,
     .help = "never, always, all but the last (0)"},
    {"width", "N", AXI_CLI_INT, F(o.width), 0, 4000,
     .help = "the grid's width (0: fitted to the actions)"},
    {"gnuplot", "FILE", AXI_CLI_STR, F(o.gp), .help = "keep gnuplot's input"},
    {"title", "TEXT", AXI_CLI_STR, F(o.title), .help = "the PNG's title"},
    {"mem-cap", "BYTES", AXI_CLI_I64, F(mem_cap), 1, INT64_MAX, AXI_CLI_UNITS,
     .help = "with --check or --mode: the fit under BYTES per\n"
             "agent (K/M/G suffixes) of the model below, its\n"
             "stages split uniformly: the peak bytes per rank, or\n"
             "the rank over the cap (what train --mem-cap checks)"},
    {"model", "NAME", AXI_CLI_STR, F(t.model),
     .help = "--mem-cap: the model (train's default mlp)"},
    {"model-config", "K=V,..", AXI_CLI_STR, F(t.model_config),
     .help = "--mem-cap: its settings"},
    {"dataset", "NAME", AXI_CLI_STR, F(t.dataset),
     .help = "--mem-cap: the data of its inputs (fashion-mnist)"},
    {"data-config", "K=V,..", AXI_CLI_STR, F(t.data_config),
     .help = "--mem-cap: the data set's settings"},
    {"batch", "N", AXI_CLI_INT, F(t.batch), 1, 1 << 20,
     .help = "--mem-cap: the mini-batch, over the units (64)"},
    {"optim", "K=V,..", AXI_CLI_STR, F(t.optim_config),
     .help = "--mem-cap: the optimizer, its state per parameter\n"
             "(train's default adamw: 2 copies)"},
    AXI_CLI_END};

static const axi_cli_opt *const g_sched_tables[] = {g_sched_opts, NULL};

const axi_cli_cmd axi_run_schedule_cmd = {
    "schedule",
    "--mode M --stages K [--micro M] [--chunks V] [--out FILE]\n"
    "| --file FILE [--out FILE] | --check FILE\n"
    "  [--mem-cap BYTES --model M [--model-config ..]] (also --mode)\n"
    "  [--grid] [--plot FILE.png] [--t-f X] [--t-b X] [--t-w X]\n"
    "| --trace FILE.json [--mode M --stages K] [--grid] [--plot FILE.png]",
    "A pipeline schedule as text, one rank's actions per line (0F3: stage\n"
    "0's forward of micro-batch 3; B, I, W backwards; STEP0; 0F3+7B1 a\n"
    "composite): a mode's first mini-batch, which train --schedule runs\n"
    "once edited (an asynchronous mode prints K + 1 mini-batches to view,\n"
    "which do not run), or a file's, verified and normalised; --check\n"
    "verifies a file (a hang is named by its cycle of waiting actions and\n"
    "drawn), and with --mem-cap its fit per agent for a model; --grid\n"
    "and --plot draw the timing model's timeline, --trace\n"
    "a run's (docs/MODES.md, \"Schedules as data\").",
    g_sched_tables,
    NULL,
    2,
    schedule_main};
