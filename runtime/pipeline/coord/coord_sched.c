/* Where the stages of a pipeline are and which lists its drivers walk: the
 * mode's, or a schedule given as data (ax_pipe_opts.schedule,
 * sched_text.h). */
#include "axon/runtime/pipeline/coord/coordinator-impl.h"

int ax_pipe_opts_stages(const ax_pipe_opts *o) {
  return o->schedule ? ax_pipe_sched_stages(o->schedule)
                     : o->K * ax_pipe_chunks(o->mode, o->chunks);
}

int ax_pipe_opts_stage_rank(const ax_pipe_opts *o, int s) {
  return o->schedule ? ax_pipe_sched_stage_rank(o->schedule, s)
                     : ax_pipe_stage_rank(o->mode, o->K, s);
}

int axi_pipe_check_schedule(const ax_pipe_opts *o) {
  const ax_pipe_sched *s = o->schedule;
  if (!s)
    return AX_OK;
  if (ax_pipe_sched_ranks(s) != o->K)
    return ax_seterr(AX_EINVAL,
                     "pipeline: the schedule has %d ranks, the pipeline %d "
                     "agents",
                     ax_pipe_sched_ranks(s), o->K);
  if (o->mode != ax_pipe_sched_mode(s))
    return ax_seterr(AX_EINVAL,
                     "pipeline: mode %s with a schedule whose stages follow "
                     "%s (its mode line, or by default zb-h1 when it has I "
                     "or W, else 1f1b)",
                     ax_pipe_mode_name(o->mode),
                     ax_pipe_mode_name(ax_pipe_sched_mode(s)));
  if (ax_pipe_units(o->mode, o->M) != ax_pipe_sched_units(s))
    return ax_seterr(AX_EINVAL,
                     "pipeline: the schedule has %d micro-batches, the "
                     "pipeline %d",
                     ax_pipe_sched_units(s), o->M);
  return AX_OK;
}

int axi_pipe_plan_of(const ax_pipe *p, long n, ax_pipe_plan **out) {
  if (p->o.schedule)
    return ax_pipe_sched_plan(p->o.schedule, n, out);
  return ax_pipe_plan_new(p->o.mode, p->R, p->v, p->o.M, n, out);
}
