/* Calling every stage of a pipeline at once, and the errors that name the
 * stage (coordinator-impl.h). */
#include <stdio.h>

#include "axon/runtime/autograd/autograd.h"

#include "axon/runtime/pipeline/coord/coordinator-impl.h"

int64_t axi_pipe_timeout(const ax_pipe *p) {
  return p->o.timeout_ms > 0 ? p->o.timeout_ms : 60000;
}

int axi_pipe_stage_err(ax_pipe *p, int s, int err) {
  if (err == AX_OK)
    return err;
  char m[700];
  snprintf(m, sizeof m, "%s", ax_errmsg());
  return ax_seterr(err, "stage %d on agent %s: %s", s, p->agents[s], m);
}

int axi_pipe_all_stages(ax_pipe *p, uint64_t ctx, const char *method,
                        axi_pipe_args_fn args, axi_pipe_reply_fn reply,
                        void *user) {
  ax_future *f[AX_PIPE_MAX_STAGES] = {NULL};
  ax_call_opts co = {.timeout_ms = axi_pipe_timeout(p), .autograd_ctx = ctx};
  int err = AX_OK, bad = -1;
  char msg[700] = ""; /* the first error's: later waits overwrite the
                         thread's */
  for (int s = 0; s < p->K && err == AX_OK; s++) {
    ax_values *a = NULL;
    err = args(user, s, &a);
    if (err == AX_OK && a) /* no arguments: this stage is not called */
      err = ax_rref_rpc_async(p->node, p->host[s], method, a, &co, &f[s]);
    ax_values_free(a);
    if (err != AX_OK) {
      bad = s;
      snprintf(msg, sizeof msg, "%s", ax_errmsg());
    }
  }
  for (int s = 0; s < p->K; s++) { /* every issued call is waited for */
    if (!f[s])
      continue;
    int e = ax_future_wait(f[s], axi_pipe_timeout(p) + 1000);
    if (e == AX_OK)
      e = ax_future_err(f[s]);
    if (e != AX_OK && err == AX_OK) {
      err = e;
      bad = s;
      snprintf(msg, sizeof msg, "%s",
               ax_future_is_done(f[s]) ? ax_future_errmsg(f[s])
                                       : "no answer in time");
      if (ctx) /* the stages waiting for what s would have pushed */
        ax_dist_context_release(p->node, ctx, 10000);
    }
    if (e == AX_OK && reply &&
        (e = reply(user, s, ax_future_values(f[s]))) != AX_OK && err == AX_OK) {
      err = e;
      bad = s;
      snprintf(msg, sizeof msg, "%s", ax_errmsg());
    }
    ax_future_release(f[s]);
  }
  if (bad < 0)
    return err;
  ax_seterr(err, "%s", msg);
  return axi_pipe_stage_err(p, bad, err);
}
