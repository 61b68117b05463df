/* Stage-driven execution, the agent's side: the order of one rank's actions.
 *
 * The coordinator (coord_run.c) issues each rank's actions ahead of their
 * dependencies; the stages wait for the data themselves (activations and
 * gradients in the unit's context), so an action starts the moment its
 * inputs arrive instead of a coordinator round trip later. What
 * the coordinator's wait gave before, the line gives now: a rank runs its
 * actions one at a time, in its list's order, even when several calls
 * arrive at once or out of order, and even across the stages it holds
 * (chunked modes).
 *
 * A sequenced call carries three metadata values (ax_call_opts.meta):
 *   "pipe.line" the rank's line id, chosen by the coordinator (lines are
 *               told apart by caller and id);
 *   "pipe.gen"  the train call (ax_pipe_train) it belongs to, increasing;
 *   "pipe.seq"  its index among that call's sequenced actions of the rank,
 *               from 0.
 * A call without them runs at once, as before (evaluation, state, tests).
 *
 * The calls of a line run on the line's own thread, in order, and a second
 * thread of the line sends their replies (so the next action does not wait
 * for a reply's encoding and sending); every sequenced call answers
 * through a deferred future. The threads exist while a host uses the line
 * (a pipeline is set up), none on an idle agent. A call of a newer gen cancels
 * what an older one left queued (AX_ECANCELLED); one of an older gen is refused
 * (AX_ESTALE). Once an action fails, the rest of its gen is cancelled instead
 * of run. Hostile values are bounded: seq at most AXP_LINE_AHEAD_MAX beyond the
 * next one, a seq queued twice is refused, entries past their caller's
 * deadline are answered with AX_ETIMEOUT. Internal to runtime/pipeline/. */
#ifndef AX_PIPELINE_STAGE_LINE_H
#define AX_PIPELINE_STAGE_LINE_H

#include "axon/rpc/rpc.h"

#define AXP_META_LINE "pipe.line"
#define AXP_META_GEN "pipe.gen"
#define AXP_META_SEQ "pipe.seq"
#define AXP_LINE_AHEAD_MAX 4096

typedef struct axi_pipe_line axi_pipe_line;
typedef int (*axi_pipe_line_fn)(ax_call_ctx *cc, void *host,
                                const ax_values *args, ax_values *out);

/* Runs fn(cc, host, args, out) now when cc carries no sequence; else
 * queues it on its line (joining *slot, the host's line, to it) and answers
 * through a deferred future, running the line if it is idle. */
int axi_pipe_line_call(ax_call_ctx *cc, axi_pipe_line **slot, void *host,
                       axi_pipe_line_fn fn, const ax_values *args,
                       ax_values *out);

/* Cancels host's queued calls (AX_ECANCELLED), waits until none of them
 * is running, and leaves its line (*slot = NULL). Call before clearing or
 * freeing the host, without holding any lock its actions take. */
void axi_pipe_line_detach(axi_pipe_line **slot, void *host);

/* Calls queued on the host's line and not yet run (0 without a line): for
 * tests that must know a call arrived before they send the next. */
int axi_pipe_line_queued(axi_pipe_line *const *slot);

#endif
