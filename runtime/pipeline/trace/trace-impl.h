/* The body of ax_trace, shared by trace.c (recording, encoding) and
 * trace_json.c (the JSON writer and reader). */
#ifndef AX_PIPELINE_TRACE_IMPL_H
#define AX_PIPELINE_TRACE_IMPL_H

#include <pthread.h>

#include "axon/runtime/pipeline/trace/trace.h"

#define AXI_TRACE_LABEL_MAX 64

/* A process name (tid = -1) or thread name. */
typedef struct axi_trace_label {
  int pid, tid;
  char name[AXI_TRACE_LABEL_MAX];
} axi_trace_label;

struct ax_trace {
  pthread_mutex_t mu;
  ax_trace_event *ev;
  size_t n, cap, max, dropped;
  axi_trace_label *labels;
  size_t n_labels, cap_labels;
  int64_t clock_offset_us;
};

/* Adds or replaces a label; the caller holds t->mu. */
int axi_trace_label_locked(ax_trace *t, int pid, int tid, const char *name);
/* Appends one event; the caller holds t->mu. */
int axi_trace_add_locked(ax_trace *t, const ax_trace_event *ev);

#endif
