/* Pictures of a schedule (contract in axon_run_schedule_view.h): a plan's
 * simulated timeline, or a run's trace, as a text grid and a PNG, and the
 * command `schedule-view` that draws either. */
#include "agents/axon_run_schedule_view.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agents/axon_run.h"
#include "axon/kernels/error.h"

#define MAXS AX_PIPE_PLAN_MAX_STAGES

/* Whether `prog` is an executable in a folder of $PATH. */
static int on_path(const char *prog) {
  const char *p = getenv("PATH");
  char dir[PATH_MAX];
  while (p && *p) {
    size_t n = strcspn(p, ":");
    if (n > 0 && n + strlen(prog) + 2 < sizeof dir) {
      snprintf(dir, sizeof dir, "%.*s/%s", (int)n, p, prog);
      if (access(dir, X_OK) == 0)
        return 1;
    }
    p += n + (p[n] == ':');
  }
  return 0;
}

/* Writes the gnuplot input of the slots to o->gp (when set) and runs
 * gnuplot on it. 0, 1 on a failure, 3 without gnuplot. */
static int draw_png(const ax_pipe_slot *s, long n, int ranks, int U,
                    const char *title, const axi_run_view_opts *o) {
  int W = 0, H = 0;
  const char *size = getenv("PLOT_SIZE"); /* as scripts/plot_run.sh */
  if (size && sscanf(size, "%d,%d", &W, &H) != 2)
    W = H = 0;
  ax_pipe_plot_opts po = {o->plot, title, getenv("PLOT_TERM"), W, H, o->unit};
  if (o->gp) {
    FILE *f = fopen(o->gp, "w");
    int rc = f ? ax_pipe_timeline_gnuplot(s, n, ranks, U, &po, f) : AX_EIO;
    if ((f && fclose(f) != 0) || rc != AX_OK) {
      fprintf(stderr, "axon-run: %s: %s\n", o->gp,
              f ? ax_errmsg() : "cannot write");
      return 1;
    }
  }
  if (!on_path("gnuplot")) {
    fprintf(stderr, "axon-run: gnuplot is not installed (apt-get install "
                    "gnuplot-nox): no plot\n");
    return 3;
  }
  FILE *g = popen("gnuplot", "w");
  if (!g) {
    perror("axon-run: gnuplot");
    return 1;
  }
  int rc = ax_pipe_timeline_gnuplot(s, n, ranks, U, &po, g);
  int st = pclose(g);
  if (rc != AX_OK || st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "axon-run: gnuplot failed on %s%s%s\n", o->plot,
            rc != AX_OK ? ": " : "", rc != AX_OK ? ax_errmsg() : "");
    return 1;
  }
  fprintf(stderr, "axon-run: %s (%ld actions, %d ranks)\n", o->plot, n, ranks);
  return 0;
}

int axi_run_view_slots(const ax_pipe_slot *s, long n, int ranks, int U,
                       const char *what, const axi_run_view_opts *o) {
  if (o->grid) {
    printf("%s\n", what);
    if (ax_pipe_timeline_grid(s, n, ranks, U, o->width, stdout) != AX_OK) {
      fprintf(stderr, "axon-run: %s\n", ax_errmsg());
      return 1;
    }
    fflush(stdout);
  }
  return o->plot ? draw_png(s, n, ranks, U, o->title ? o->title : what, o) : 0;
}

int axi_run_schedule_view(const ax_pipe_plan *plan,
                          const axi_run_view_opts *o) {
  int S = ax_pipe_plan_stages(plan), K = ax_pipe_plan_ranks(plan),
      U = ax_pipe_plan_units(plan), m = ax_pipe_plan_mode(plan);
  double tf[MAXS], tb[MAXS], tw[MAXS], st[MAXS];
  for (int i = 0; i < S; i++) {
    tf[i] = o->t_f ? o->t_f[i] : o->f;
    tb[i] = o->t_b ? o->t_b[i] : o->b;
    tw[i] = o->t_w ? o->t_w[i] : o->w;
    st[i] = o->step;
  }
  ax_formula_comm comm = {.step = st};
  ax_pipe_slot *s = NULL;
  long n = 0;
  double per = 0;
  int rc = ax_formula_time_plan(plan, tf, tb, tw, o->recompute, &comm, &per);
  if (rc == AX_OK)
    rc = ax_formula_timeline(plan, tf, tb, tw, o->recompute, &comm, &s, &n);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 1;
  }
  char what[256];
  long nb = ax_pipe_plan_batches(plan);
  snprintf(what, sizeof what,
           "%s: %d ranks, %d stages, %ld mini-batch%s of %d unit%s, %.4g per "
           "mini-batch",
           ax_pipe_mode_name(m), K, S, nb, nb > 1 ? "es" : "", U,
           U > 1 ? "s" : "", per);
  rc = axi_run_view_slots(s, n, K, U, what, o);
  free(s);
  return rc;
}

/* ---- the command ------------------------------------------------------- */

typedef struct view_cli {
  const char *mode, *trace;
  int K, M, v, recompute;
  long batches, skip;
  double tf[MAXS], tb[MAXS], tw[MAXS];
  int ntf, ntb, ntw;
  axi_run_view_opts o;
} view_cli;

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
  view_cli *c = d;
  return costs(a, c->tf, &c->ntf);
}
static int set_tb(void *d, const char *a) {
  view_cli *c = d;
  return costs(a, c->tb, &c->ntb);
}
static int set_tw(void *d, const char *a) {
  view_cli *c = d;
  return costs(a, c->tw, &c->ntw);
}

/* A cost list given for S stages: one value for all, or S. */
static const double *per_stage(double *a, int n, int S, double *scalar) {
  if (n == 1)
    *scalar = a[0];
  return n == S ? a : NULL;
}

static int view_trace(view_cli *c) {
  ax_trace *tr = NULL;
  if (ax_trace_read(c->trace, &tr) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 1;
  }
  int m = c->mode ? ax_pipe_mode_index(c->mode) : -1, map[MAXS], S = 0;
  if (m >= 0 && c->K > 0) { /* the mode's placement */
    S = c->K * ax_pipe_chunks(m, c->v);
    for (int i = 0; i < S && i < MAXS; i++)
      map[i] = ax_pipe_stage_rank(m, c->K, i);
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
  rc = axi_run_view_slots(s, n, ranks, U, what, &c->o);
  free(s);
  return rc;
}

static int view_main(int argc, char **argv) {
  view_cli c = {.M = 4, .o = {.f = 1, .b = 1, .w = 1}};
  int rc = axi_cli_parse(&axi_run_prog, &axi_run_schedule_view_cmd, 2, argc,
                         argv, &c);
  if (rc >= 0)
    return rc;
  if (!c.o.grid && !c.o.plot)
    c.o.grid = 1;
  if (c.trace)
    return view_trace(&c);
  int m = c.mode ? ax_pipe_mode_index(c.mode) : -1;
  if (m < 0 || c.K < 1) {
    fprintf(stderr,
            "axon-run schedule-view: needs --mode (%s) and --stages "
            "K, or --trace FILE\n",
            ax_pipe_mode_list());
    return 2;
  }
  int v = ax_pipe_chunks(m, c.v), U = ax_pipe_units(m, c.M), S = c.K * v;
  long n = c.batches;
  if (n < 1) /* one flush, or enough units for a steady state */
    n = ax_pipe_flushes(m)           ? 1
        : (3L * c.K + U - 1) / U > 2 ? (3L * c.K + U - 1) / U
                                     : 2;
  for (int i = 0; i < 3; i++) {
    int got = i == 0 ? c.ntf : i == 1 ? c.ntb : c.ntw;
    if (got > 1 && got != S) {
      fprintf(stderr, "axon-run: %d costs for %d stages\n", got, S);
      return 2;
    }
  }
  c.o.t_f = per_stage(c.tf, c.ntf, S, &c.o.f);
  c.o.t_b = per_stage(c.tb, c.ntb, S, &c.o.b);
  c.o.t_w = per_stage(c.tw, c.ntw, S, &c.o.w);
  c.o.recompute = c.recompute;
  ax_pipe_plan *plan = NULL;
  if (ax_pipe_plan_new(m, c.K, v, c.M, n, &plan) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 1;
  }
  rc = axi_run_schedule_view(plan, &c.o);
  ax_pipe_plan_free(plan);
  return rc;
}

#define F(field) offsetof(view_cli, field)

static const axi_cli_opt g_view_opts[] = {
    {"mode", "MODE", AXI_CLI_STR, F(mode), .values_fn = ax_pipe_mode_list,
     .help = "%s"},
    {"stages", "K", AXI_CLI_INT, F(K), 1, MAXS, .help = "ranks (agents)"},
    {"micro", "M", AXI_CLI_INT, F(M), 1, 1 << 16,
     .help = "micro-batches per mini-batch (4)"},
    {"chunks", "V", AXI_CLI_INT, F(v), 0, MAXS,
     .help = "chunked modes: stages per rank (2)"},
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
    {"trace", "FILE", AXI_CLI_STR, F(trace),
     .help = "draw a run's trace (--trace of axon-run train);\n"
             "--mode and --stages give the ranks of its stages"},
    {"grid", NULL, AXI_CLI_FLAG, F(o.grid),
     .help = "the text grid on stdout (the default without\n"
             "--plot)"},
    {"width", "N", AXI_CLI_INT, F(o.width), 0, 4000,
     .help = "the grid's width (0: fitted to the actions)"},
    {"plot", "FILE.png", AXI_CLI_STR, F(o.plot),
     .help = "draw the PNG with gnuplot"},
    {"gnuplot", "FILE", AXI_CLI_STR, F(o.gp), .help = "keep gnuplot's input"},
    {"title", "TEXT", AXI_CLI_STR, F(o.title), .help = "the PNG's title"},
    AXI_CLI_END};

static const axi_cli_opt *const g_view_tables[] = {g_view_opts, NULL};

const axi_cli_cmd axi_run_schedule_view_cmd = {
    "schedule-view",
    "--mode M --stages K [--micro M] [--chunks V] [--grid]\n"
    "[--plot FILE.png] [--t-f X] [--t-b X] [--t-w X] [--t-step X]\n"
    "| --trace FILE.json [--mode M --stages K] [--plot FILE.png]",
    "A schedule's timeline from the timing model, or a run's from its\n"
    "trace, as a rank x time grid: text (F, B, I, W, STEP; idle '.') and a "
    "PNG.",
    g_view_tables,
    NULL,
    1,
    view_main};
