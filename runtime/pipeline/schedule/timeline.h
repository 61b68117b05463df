/* Pictures of a schedule: a timeline (ax_pipe_slot, formula.h: each
 * action's rank, start and end) drawn as a rank x time grid, as text for
 * the terminal or as a gnuplot input for a PNG, and the same timeline read
 * from a real run's trace (trace/trace.h), so the simulated and the
 * measured pictures compare side by side.
 *
 * Tokens. An action is written as in schedule files: its stage, its kind
 * (F, B, I, W) and its unit, "0F3", "1I2", "0W5"; a STEP is "STEP"; a
 * composite "0F3+7B1". The unit is counted over the whole timeline
 * (batch U + micro, U units per mini-batch), so the mini-batches of a
 * longer timeline stay apart; with one mini-batch it is the micro-batch.
 *
 * Colours (the gnuplot input; the same for a simulation and a trace): F
 * blue, B purple, I orange, W green, STEP black, a composite F&B teal,
 * idle light grey.
 *
 * Thread safety: reentrant. Errors: AX_EINVAL (bad arguments), AX_ENOMEM,
 * AX_EIO (writing), with a message. */
#ifndef AX_PIPELINE_TIMELINE_H
#define AX_PIPELINE_TIMELINE_H

#include <stddef.h>
#include <stdio.h>

#include "axon/runtime/pipeline/schedule/formula.h"
#include "axon/runtime/pipeline/trace/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The token of slot s (see above) into buf (cut to fit len); U: units per
 * mini-batch. */
void ax_pipe_slot_token(const ax_pipe_slot *s, int U, char *buf, size_t len);

/* Writes the text grid of n slots on `ranks` ranks to f: a line per rank
 * ("rank 0 |0F0 0F1 ...|"), one column per equal slice of time, each
 * action's token at its start and blanks to its end (cut to the kind's
 * letter when its box is narrower than the token and a blank), idle time
 * as '.', and a last line with the time per column. width: the whole
 * line's characters (>= 20); 0 picks the columns so that an action at
 * the first quartile of the durations holds the longest token and a blank
 * (at most 4000 columns). Actions that take no time
 * (a STEP without a cost) are not drawn. */
int ax_pipe_timeline_grid(const ax_pipe_slot *s, long n, int ranks, int U,
                          int width, FILE *f);

/* What the gnuplot input draws. */
typedef struct ax_pipe_plot_opts {
  const char *png;   /* the output file (required) */
  const char *title; /* the picture's title (NULL: none) */
  const char *term;  /* gnuplot's terminal (NULL: "pngcairo") */
  int width, height; /* pixels (0: 900 x 60 per rank + 120) */
  const char *unit;  /* the time axis's unit ("s"; NULL: none) */
} ax_pipe_plot_opts;

/* Writes a gnuplot script to f that draws the slots into o->png: a box
 * per action from its start to its end on its rank's row (rank 0 on top),
 * in its kind's colour, with its token inside when the box is wide
 * enough, idle time in grey behind, a legend of the colours. */
int ax_pipe_timeline_gnuplot(const ax_pipe_slot *s, long n, int ranks, int U,
                             const ax_pipe_plot_opts *o, FILE *f);

/* The timeline of a run's trace (the stages' compute events, lane 0,
 * trace.h): "forward" is F, "backward" B (I when the stage ran a "weight"
 * W of the same unit), "recompute" the start of the backward it precedes,
 * "optim" STEP. Times are seconds from the first action drawn. Only
 * mini-batches first..last are kept (last < 0: to the end). The rows:
 * stage s on rank stage_rank[s] when stage_rank is given (S entries, S =
 * the stages in the trace); else the stages grouped by their process
 * names (the agents), ordered by their first stage, or a row per stage
 * when every stage has the same name (an emulated run). *out (malloc'd,
 * the caller frees), *n, *ranks, and *U (the most micro-batches seen).
 * AX_EINVAL when the trace has no compute event to draw. */
int ax_pipe_timeline_from_trace(const ax_trace *tr, const int *stage_rank,
                                int S, long first, long last,
                                ax_pipe_slot **out, long *n, int *ranks,
                                int *U);

#ifdef __cplusplus
}
#endif
#endif
