/* Per-step pipeline metrics, their CSV log and a one-line summary.
 *
 * A step is one mini-batch (one optimizer step for the flushed modes; one
 * mini-batch through the pipeline for ddg, fr and pipedream). The
 * coordinator fills the counters it knows (samples, loss, bytes through
 * itself, what stages report: peak memory, live stash) and derives the busy
 * and bubble fractions from the step's trace events with
 * ax_metrics_from_events.
 *
 * Definitions:
 *  - samples_per_s = samples / wall_s;
 *  - busy[s] = (time stage s spends in "forward", "backward" or "recompute"
 *    events inside the step window [t0, t1]) / (t1 - t0); overlapping
 *    events of one stage count once (their union), events are clipped to
 *    the window;
 *  - bubble = 1 - mean over stages of busy[s];
 *  - live_stash[s] = the largest "stash" argument of stage s's events in the
 *    window (or what the caller set; -1 = unknown);
 *  - peak_mem[s] bytes as the stage reports it (0 = unknown).
 * Thread safety: none needed; a writer is used by one thread. */
#ifndef AX_PIPELINE_METRICS_H
#define AX_PIPELINE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "axon/runtime/pipeline/trace/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_METRICS_MAX_STAGES 64

typedef struct ax_step_metrics {
  long step;
  int K;         /* stages, 1..AX_METRICS_MAX_STAGES */
  double wall_s; /* step wall time */
  long samples;  /* examples in the step */
  double samples_per_s;
  double loss; /* mean loss of the step */
  double lr;   /* learning rate used (0 = not reported) */
  double busy[AX_METRICS_MAX_STAGES];
  double bubble;
  size_t peak_mem[AX_METRICS_MAX_STAGES];
  int live_stash[AX_METRICS_MAX_STAGES];
  int64_t coord_bytes; /* bytes sent + received by the coordinator */
} ax_step_metrics;

/* Zeroes *m, sets step and K, live_stash[] = -1. AX_EINVAL for a bad K. */
int ax_metrics_init(ax_step_metrics *m, long step, int K);

/* Fills wall_s = (t1 - t0) / 1e6, samples_per_s (when samples > 0), busy[],
 * bubble and live_stash[] from the events of stages 0..K-1 in the window
 * [t0_us, t1_us] (events of other pids are ignored). ev may be in any
 * order. AX_EINVAL when t1 <= t0, K is bad or ev is NULL with n > 0. */
int ax_metrics_from_events(ax_step_metrics *m, const ax_trace_event *ev,
                           size_t n, int64_t t0_us, int64_t t1_us);

/* A CSV log: a header line, then one row per step:
 * step,wall_s,samples,samples_per_s,loss,lr,bubble,coord_bytes,
 * busy_0..busy_{K-1},peak_mem_0..,live_stash_0..  */
typedef struct ax_metrics_csv ax_metrics_csv;
/* Creates (truncates) path and writes the header for K stages. */
int ax_metrics_csv_open(const char *path, int K, ax_metrics_csv **out);
/* Appends a row and flushes; AX_EINVAL when m->K differs from the
 * header's. */
int ax_metrics_csv_row(ax_metrics_csv *w, const ax_step_metrics *m);
/* Closes the file; AX_EIO if a write failed. NULL-safe. */
int ax_metrics_csv_close(ax_metrics_csv *w);

/* "step 12: 1234.5 samples/s, loss 0.4321, bubble 23.4%, busy
 * 81%/77%/75%/70%, peak MiB 12.3/8.1/..., stash 4/3/2/1, coordinator
 * 1.20 MiB" into buf; returns buf (truncated to len). */
char *ax_metrics_summary(const ax_step_metrics *m, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
