/* Pictures of a schedule (contract in axon_run_schedule_view.h): a plan's
 * simulated timeline, or a run's trace, as a text grid and a PNG. */
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
