/* Chrome-trace recording for pipeline runs (`--trace FILE`).
 *
 * A trace collects complete events ("ph":"X": a name, a category, a
 * process id, a thread id, a start and a duration in microseconds, and a few
 * integer arguments) and names for processes and threads. Conventions for
 * the pipeline: pid = stage index (0-based), named after its agent with
 * ax_trace_name_process; categories "forward", "backward", "recompute",
 * "send", "recv", "optim"; step = mini-batch index, micro = micro-batch
 * index within it (-1 when the mode has none), bytes = payload size of a
 * send/recv, stash = the stage's live stash count after the event, peer =
 * the other stage of a send/recv.
 *
 * Clocks. Timestamps are CLOCK_MONOTONIC microseconds (ax_clock_us),
 * which every process on one host shares, so stage events line up with the
 * coordinator's without adjustment. For stages on other hosts, the stage
 * (or the coordinator at merge time) supplies an offset in microseconds
 * that maps the stage's clock onto the coordinator's; it is added to every
 * merged timestamp.
 *
 * Moving events between processes: a stage calls ax_trace_encode to turn
 * its events into one flat byte buffer (portable little-endian layout),
 * returns it over RPC as bytes, and the coordinator calls ax_trace_merge.
 *
 * Thread safety: every function on one ax_trace may be called from any
 * number of threads at once (a mutex per trace), except ax_trace_free.
 * Errors: AX_EINVAL for bad arguments, AX_ENOMEM, AX_EFORMAT for a
 * malformed buffer or file, AX_EIO for file errors; all with a message. */
#ifndef AX_PIPELINE_TRACE_H
#define AX_PIPELINE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/clock.h" /* ax_clock_us: the events' clock */

#ifdef __cplusplus
extern "C" {
#endif

#define AX_TRACE_NAME_MAX 48 /* bytes, NUL included; longer names are cut */
#define AX_TRACE_CAT_MAX 16

typedef struct ax_trace_event {
  char name[AX_TRACE_NAME_MAX]; /* e.g. "F3.1" */
  char cat[AX_TRACE_CAT_MAX];   /* "forward", "backward", "send", ... */
  int pid;                      /* stage index */
  int tid;                      /* thread / lane within the stage */
  int64_t ts_us;                /* start, CLOCK_MONOTONIC microseconds */
  int64_t dur_us;               /* duration, >= 0 */
  /* Arguments; -1 means absent (not written to the JSON). */
  int64_t step, micro, bytes, stash, peer;
} ax_trace_event;

typedef struct ax_trace ax_trace;

/* A new empty trace keeping at most max_events events (0 = no limit);
 * events beyond the limit are counted as dropped. NULL on out-of-memory. */
ax_trace *ax_trace_new(size_t max_events);
void ax_trace_free(ax_trace *t); /* NULL-safe */

/* An event with the given fields, every argument absent (-1) and
 * dur = end - start (0 if negative). Names are truncated to fit. */
ax_trace_event ax_trace_event_make(const char *name, const char *cat, int pid,
                                   int tid, int64_t start_us, int64_t end_us);
/* Copies *ev into the trace. AX_EINVAL for NULL arguments. */
int ax_trace_add(ax_trace *t, const ax_trace_event *ev);
/* Shorthand: make + set step/micro/bytes + add. */
int ax_trace_record(ax_trace *t, const char *name, const char *cat, int pid,
                    int tid, int64_t start_us, int64_t end_us, int64_t step,
                    int64_t micro, int64_t bytes);

/* Names a process (the "process_name" metadata event) or a thread; a later
 * call for the same ids replaces the name. */
int ax_trace_name_process(ax_trace *t, int pid, const char *name);
int ax_trace_name_thread(ax_trace *t, int pid, int tid, const char *name);
/* Copies the name of process pid (tid < 0) or thread (pid, tid) into buf;
 * AX_ENOTFOUND when it has none. */
int ax_trace_get_name(const ax_trace *t, int pid, int tid, char *buf,
                      size_t len);

size_t ax_trace_count(const ax_trace *t);   /* events held */
size_t ax_trace_dropped(const ax_trace *t); /* events refused by the limit */
/* A malloc'd copy of the events sorted by (ts, pid, tid); the caller frees
 * *out (NULL when n = 0). */
int ax_trace_events(const ax_trace *t, ax_trace_event **out, size_t *n);
/* Drops every event (names and the offset are kept). */
void ax_trace_clear(ax_trace *t);

/* The offset (microseconds) ax_trace_encode writes into its buffers; a
 * stage on another host sets it to (coordinator clock - own clock). */
void ax_trace_set_clock_offset(ax_trace *t, int64_t offset_us);
/* Encodes the names and events into a new malloc'd buffer (*buf, *len; the
 * caller frees it). When `clear` is set the events are dropped atomically
 * with the copy, so a stage can ship its events once per step. */
int ax_trace_encode(ax_trace *t, int clear, void **buf, size_t *len);
/* Decodes a buffer from ax_trace_encode and adds its names and events to
 * dst, shifting timestamps by the buffer's offset plus extra_offset_us.
 * Nothing is added when the buffer is malformed (AX_EFORMAT). */
int ax_trace_merge(ax_trace *dst, const void *buf, size_t len,
                   int64_t extra_offset_us);

/* Writes {"displayTimeUnit":"ms","traceEvents":[...]} to path: metadata
 * events first, then the events sorted by time, one per line. */
int ax_trace_write(const ax_trace *t, const char *path);
/* Reads a file written by ax_trace_write into a new trace (*out; free with
 * ax_trace_free). Handles the writer's own output (one JSON object per line
 * with string and integer values and one nested "args" object), not
 * arbitrary JSON. */
int ax_trace_read(const char *path, ax_trace **out);

#ifdef __cplusplus
}
#endif
#endif
