/* What axon-run train's pipeline run (axon_run_pipe.c) says: how it trains,
 * the trace and the per-step metrics of --trace and --csv, and the
 * summary. */
#include <stdio.h>
#include <stdlib.h>

#include "agents/axon_run.h"
#include "axon/models/data/dataset.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include "axon/runtime/pipeline/stage/staleness.h"
#include "axon/runtime/pipeline/state/freeze.h"
#include "axon/runtime/pipeline/trace/metrics.h"
#include "axon/runtime/pipeline/trace/trace.h"

int axi_run_stages(const axi_run_pipe_args *a) {
  return a->schedule ? ax_pipe_sched_stages(a->schedule)
                     : a->K * ax_pipe_chunks(a->mode, a->chunks);
}

void axi_run_announce(const axi_run_pipe_args *a, const int *bounds) {
  char sb[256];
  fprintf(stderr,
          "axon-run: %s on %s, %s%s%s, %d stages (blocks %s)%s, "
          "%d micro-batches, batch %d\n",
          a->model, a->dataset, ax_pipe_mode_name(a->mode),
          a->staleness ? " with staleness " : "",
          a->staleness ? ax_staleness_name(a->staleness) : "",
          axi_run_stages(a),
          ax_partition_format(bounds, axi_run_stages(a), sb, sizeof sb),
          a->replicas > 1 ? " x replicas" : "", ax_pipe_units(a->mode, a->M),
          a->batch);
  if (a->replicas > 1)
    fprintf(stderr,
            "axon-run: %d replicas, each on batch / %d rows of every "
            "mini-batch, gradients averaged at each update\n",
            a->replicas, a->replicas);
  if (a->tensor_parallel > 1)
    fprintf(stderr,
            "axon-run: every stage on %d agents, its split layers "
            "shared among them\n",
            a->tensor_parallel);
  if (a->precision != AX_PREC_FP32)
    fprintf(stderr,
            "axon-run: %s GEMMs and activations, f32 weights and optimizer "
            "state\n",
            ax_precision_name(a->precision));
}

/* Trace events as the coordinator saw them (issue, completion, busy). */
static void add_coordinator_view(const axi_run_pipe_args *a, ax_pipe *p,
                                 ax_trace *tr) {
  long ne;
  const ax_pipe_event *ev = ax_pipe_events(p, &ne);
  for (long i = 0; i < ne; i++) {
    const ax_pipe_event *e = &ev[i];
    int64_t done = (int64_t)(e->t_done * 1e6),
            iss = (int64_t)(e->t_issue * 1e6);
    int64_t start = done - (int64_t)(e->busy_s * 1e6);
    char name[32];
    snprintf(name, sizeof name, "%c%d.%d", e->op.kind ? 'B' : 'F', e->op.batch,
             e->op.micro);
    ax_trace_event te =
        ax_trace_event_make(name, e->op.kind ? "backward" : "forward",
                            e->op.stage, 0, start > iss ? start : iss, done);
    te.step = e->op.batch;
    te.micro = ax_pipe_units(a->mode, a->M) > 1 ? e->op.micro : -1;
    te.stash = e->live;
    ax_trace_add(tr, &te);
    if (start > iss) {
      ax_trace_event rv =
          ax_trace_event_make("recv", "recv", e->op.stage, 1, iss, start);
      rv.step = e->op.batch;
      ax_trace_add(tr, &rv);
    }
  }
}

void axi_run_write_outputs(const axi_run_pipe_args *a, ax_pipe *p,
                           const axi_run_steps *f, double t0) {
  ax_trace *tr = ax_trace_new(0);
  if (!tr)
    return;
  int S = ax_pipe_stages(p); /* the last pipeline's (a freeze re-packs) */
  for (int s = 0; s < S; s++) {
    ax_trace_name_process(tr, s, ax_pipe_stage_agent(p, s));
    ax_trace_name_thread(tr, s, 0, "compute");
    ax_trace_name_thread(tr, s, 1, "recv");
    ax_trace_name_thread(tr, s, 2, "send");
  }
  /* The stages' own events; without them (an old agent), the coordinator's
   * view: compute as the stage reported it, the wait before it as recv. */
  if (ax_pipe_trace(p, tr) != AX_OK || ax_trace_count(tr) == 0)
    add_coordinator_view(a, p, tr);
  if (a->trace && ax_trace_write(tr, a->trace) != AX_OK)
    fprintf(stderr, "axon-run: trace: %s\n", ax_errmsg());
  ax_metrics_csv *csv = NULL;
  if (a->csv && ax_metrics_csv_open(a->csv, S, &csv) != AX_OK)
    fprintf(stderr, "axon-run: csv: %s\n", ax_errmsg());
  ax_trace_event *all = NULL;
  size_t n = 0;
  ax_trace_events(tr, &all, &n);
  ax_pipe_stats st;
  ax_pipe_get_stats(p, &st);
  for (long t = 0; csv && t < f->steps; t++) {
    ax_step_metrics m;
    ax_metrics_init(&m, t, S);
    m.samples = f->batch;
    m.loss = f->loss[t];
    m.coord_bytes =
        (int64_t)(st.coord_bytes / (uint64_t)(f->steps ? f->steps : 1));
    double lo = t ? f->done_at[t - 1] : t0;
    int64_t t0u = (int64_t)(lo * 1e6), t1u = (int64_t)(f->done_at[t] * 1e6);
    if (t1u <= t0u)
      t1u = t0u + 1;
    ax_metrics_from_events(&m, all, n, t0u, t1u);
    for (int s = 0; s < S; s++)
      m.peak_mem[s] = (size_t)st.peak_bytes[s];
    ax_metrics_csv_row(csv, &m);
  }
  ax_metrics_csv_close(csv);
  free(all);
  ax_trace_free(tr);
}

void axi_run_print_bits(const char *name, double nats, const char *unit) {
  if (unit)
    printf(" %s_bits_per_%s=%.4f", name, unit, ax_bits_per_token(nats));
}

void axi_run_summary(const axi_run_pipe_args *a, ax_pipe *p,
                     const axi_run_steps *f, const ax_pipe_stats *st,
                     long total, double acc, double tl, double spb,
                     const char *unit) {
  printf("summary: model=%s dataset=%s mode=%s stages=%d micro=%d steps=%ld"
         " final_loss=%.4f test_accuracy=%.2f%% samples_per_s=%.1f "
         "ms_per_step=%.1f coordinator_bytes_per_step=%.0f train_seconds="
         "%.1f test_loss=%.9g",
         a->model, a->dataset, ax_pipe_mode_name(a->mode), axi_run_stages(a),
         ax_pipe_units(a->mode, a->M), f->steps,
         f->steps ? f->loss[f->steps - 1] : 0.0, 100.0 * acc,
         (double)(f->steps * a->batch) / st->seconds,
         1e3 * st->seconds / (double)total, (double)st->coord_bytes / total,
         st->seconds, tl);
  axi_run_print_bits("final", f->steps ? f->loss[f->steps - 1] : 0.0, unit);
  axi_run_print_bits("test", tl, unit);
  if (spb >= 0)
    printf(" modelled_seconds=%.3f modelled_ms_per_step=%.2f",
           spb * (double)f->steps, 1e3 * spb);
  if (a->replicas > 1)
    printf(" replicas=%d", a->replicas);
  if (a->tensor_parallel > 1)
    printf(" tensor_parallel=%d", a->tensor_parallel);
  if (a->precision != AX_PREC_FP32)
    printf(" precision=%s", ax_precision_name(a->precision));
  ax_freeze_stats fz;
  ax_pipe_freeze_stats(p, &fz);
  if (fz.blocks)
    printf(" frozen_blocks=%d final_stages=%d final_replicas=%d "
           "cache_hits=%ld cache_misses=%ld",
           fz.blocks, ax_pipe_stages(p), fz.replicas, fz.hits, fz.misses);
  printf("%s\n", a->emulate ? " emulated=1" : "");
  printf("stages:"); /* the last pipeline's (a freeze re-packs) */
  for (int s = 0; s < ax_pipe_stages(p); s++)
    printf(" [%d %s busy %.0f%% peak states %d versions %d state %.1f MB]", s,
           ax_pipe_stage_agent(p, s), 100 * st->busy_frac[s], st->peak_live[s],
           st->peak_versions[s], (double)st->peak_bytes[s] / 1e6);
  printf("\n");
  if (a->trace)
    printf("trace: %s (open in https://ui.perfetto.dev)\n", a->trace);
}
