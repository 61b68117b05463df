/* Pictures of a schedule for axon-run (agents/axon_run_schedule_view.c):
 * a plan's simulated timeline (schedule/formula.h) or a run's trace drawn
 * as a rank x time text grid and as a PNG through gnuplot
 * (schedule/timeline.h), for axon-run schedule's --grid, --plot FILE.png
 * and --trace FILE.json. */
#ifndef AX_AXON_RUN_SCHEDULE_VIEW_H
#define AX_AXON_RUN_SCHEDULE_VIEW_H

#include "agents/axon_cli.h"
#include "axon/runtime/pipeline/schedule/timeline.h"

/* What to draw and with which costs. */
typedef struct axi_run_view_opts {
  int grid;          /* 1: the text grid on stdout */
  int width;         /* the grid's characters per line (0: fitted) */
  const char *plot;  /* the PNG to draw (NULL: none) */
  const char *gp;    /* also keep gnuplot's input here (NULL: none) */
  const char *title; /* the picture's title (NULL: the plan's) */
  /* Seconds (or any unit) per action, stage by stage (ax_pipe_plan_stages
   * entries, e.g. from a profile: ax_stage_time); NULL: the scalars
   * below for every stage. A whole B costs t_b + t_w. */
  const double *t_f, *t_b, *t_w;
  double f, b, w, step; /* the scalars: F, I (B's input half), W, STEP */
  int recompute;        /* AX_RECOMPUTE_* */
  const char *unit;     /* the time axis's unit (NULL: none) */
} axi_run_view_opts;

/* Simulates plan with o's costs and draws its timeline (the grid on
 * stdout, the PNG through gnuplot), after a line naming the mode, ranks,
 * stages, units and the time per mini-batch. 0, 1 on a failure (a
 * message on stderr), 3 when gnuplot is missing. */
int axi_run_schedule_view(const ax_pipe_plan *plan, const axi_run_view_opts *o);

/* Draws a timeline (n slots on `ranks` rows, U units per mini-batch) as
 * o says (the costs unused): the trace path of the same pictures. */
int axi_run_view_slots(const ax_pipe_slot *s, long n, int ranks, int U,
                       const char *what, const axi_run_view_opts *o);

#endif
