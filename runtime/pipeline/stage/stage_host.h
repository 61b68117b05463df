/* The pipeline stage host: remote object kind "axon.pipe.stage" (registered by
 * ax_pipe_init on every agent) that runs one model stage under a schedule
 * the coordinator drives (runtime/pipeline/coord/coordinator.h).
 *
 * Configuration: "model=NAME[,stage.h keys]", e.g.
 * "model=mlp,stage=1,splits=0/2/4,seed=3,widths=784/64/10": the model name
 * first, then the keys of the model stage kinds (runtime/autograd/stage.h).
 *
 * Every method's argument list and reply is a typed message of
 * stage_msg-impl.h, written and read only by its encoder and its decoder,
 * which refuses a malformed list (AX_EBADARG naming the message and the
 * field) before the method looks at it.
 *
 * Methods (every call on one host runs one at a time under the stage lock).
 * "fwd", "bwd", "bwdi", "bwdw" and "step" calls that carry the sequence
 * metadata of stage_line-impl.h run in their agent's order on its line, one at
 * a time across the stages the agent holds, however many are in flight;
 * without it they run at once. "setup", "teardown" and destroying the host
 * cancel its queued actions and wait for the running one. A push
 * that failed makes the next fwd/bwd fail with its error.
 *  - "setup" [mode, recompute, optim config (str), prev, next, self id,
 *    sum order, and optionally staleness, delay, gamma (f64; < 0: the
 *    default),
 *    warm-up, and optionally replicas R, group tag (str), R member names
 *    (str)]:
 *    the recompute option is informational (each "fwd" says in its flags
 *    whether the unit keeps only its inputs); prev/next are the
 *    neighbours' object RRefs, or i64 0 at the ends;
 *    self id is ax_rref_id of this host's own RRef, the key prev pushes
 *    its activations to (ax_dist_push, runtime/autograd/autograd.h).
 *    Creates the local
 *    optimizer (models/optim.h keys). The staleness correction
 *    (staleness.h; absent: none) with the stage's delay (ax_pipe_delay)
 *    changes the weights a training forward and a backward use and the
 *    step size; AX_EINVAL for a bad one or any but none in a flushed mode.
 *    The sum order (ax_sum_order, kernels/sum_tree.h) is how a STEP sums
 *    its units' gradients (micro-batches 0 .. units-1 as the leaves) and
 *    how the replicas combine theirs. With R > 1 replicas the host joins
 *    the collective group `tag` of the members (the agents holding this
 *    stage in every replica of the pipeline, in replica order, this one
 *    among them; collective.h) in that order, and every STEP first
 *    replaces its summed gradient by the group's combination,
 *    bit-identical on every member: R replicas train as one pipeline on R
 *    times the batch, each on its shard. AX_SUM_TREE: the group's tree
 *    sum (the coordinator divided every loss by the whole mini-batch's
 *    label counts), the tree over all R x units micro-batches;
 *    AX_SUM_CHAIN: the group's average (ring all-reduce; PyTorch DDP's
 *    rule: per-replica means, averaged). Then optionally the T
 *    tensor-parallel members' group; the precision (absent: fp32), which
 *    becomes the stage net's (ax_net.precision), the precision of every
 *    forward and backward (models/module.h): in bf16 its activations and
 *    input gradients leave it as AX_BF16 tensors; and the ties (models/model.h)
 * whose other copy is on another stage, each with the group of the two stages
 * (rank 0: block a's; stage_msg-impl.h); every tie of the model that crosses
 * the stage's bounds must be named (AX_EINVAL otherwise). A STEP then sums,
 * after the replicas' combination (the whole gradient, under ZeRO too), each
 * tie's two gradients: in the stage when it holds both copies, else over the
 * tie's group (replica r's and member t's copies pair up). A STEP with such an
 * exchange leaves its update pending until the exchange is done: the stage's
 * next operation that reads its weights or its optimizer state ("fwd", "bwd",
 * "step", "state_save", checkpoints, "settle") applies it first.
 *  - "fwd" [batch, micro, seed, flags, n_in, inputs..., n_lab, labels...,
 *    norms (n_lab i64)]: flags bit 0 = training, bit 1 = keep only the
 *    inputs and replay the forward at backward (the mode table's
 *    ax_pipe_replays). A forward runs under its unit's distributed
 *    autograd context (the call's; AX_ESTATE without one, unless it
 *    neither takes nor pushes activations nor trains). With n_in = 0 the
 *    inputs are the activations prev pushed under it (ax_dist_take,
 *    waited for up to the call's deadline), whose receive edges it
 *    records; a stage with a next pushes its outputs there right away
 *    under the context (ax_dist_push: stage to stage, not through the
 *    caller), recording the send. Training records the unit's function
 *    in the context (ax_dist_record_held).
 *    Training keeps a per-unit state until its backward: the saved
 *    activations (or only the inputs) and, when the mode's backward uses
 *    stashed weights, the version the forward used (copy-on-update: before
 *    an update, states that still use the live weights get one separate
 *    copy of the flat buffer). The last stage's training forward computes
 *    the loss through ax_forward_xent (models/loss.h): where the model's
 *    head fuses it (GPT), the logits are never formed and the state keeps
 *    the head's gradients in its saved activations; otherwise the state
 *    keeps the logits' gradient. A state its backward replays computes the
 *    loss alone and keeps the labels instead; the replay computes the
 *    gradient. An evaluation's loss comes from the logits. Returns [busy_us
 * (the call's time less its wait for the activations), cpu_us (the CPU time it
 * used), live_states, weight_versions, state_bytes (everything the states keep:
 * activations or inputs, the logits' gradient or the labels, and weight
 * versions)] and, on the last stage, [loss, correct, count] after them.
 *  - "bwd" [batch, micro, step, units]: under the unit's context. The
 *    output gradient is the loss's on the last stage, else the one the next
 *    stage sent back along the context's receive edge (ax_dist_take_grads,
 *    waited for up to the call's deadline). A replayed state first
 *    recomputes its forward (update_stats = 0, same dropout seed) with the
 *    forward's weights or, when the mode says "latest" (fr), the current
 *    ones. Parameter gradients accumulate in the context's buffer for this
 *    stage, which the stage then takes out of the context for the STEP;
 *    the input gradient goes back to prev along the receive edge
 *    (ax_dist_pass_grads), without waiting. step = 1 runs the STEP of
 *    `batch` after it (see "step"). Returns [busy_us (less the wait for
 *    the output gradient), cpu_us, live_states,
 *    weight_versions, state_bytes].
 *  - "step" [batch, units]: updates the weights with the sum, in the
 *    sum order over micro-batches 0..units-1, of the gradients of batch's
 *    units
 *    (AX_ESTATE unless every unit's backward ran). Returns the five
 *    statistics.
 *  - "state_save" []: [params (P), buffers (Q) or an empty tensor].
 *  - "settle" []: applies the last STEP's pending update (above), waiting
 *    for its ties' exchanges; []. The coordinator calls it on every stage
 *    at once at the end of a train call, so that the replicas' all-gather
 *    of a ZeRO update runs together.
 *  - "trace" []: [bytes] the events recorded since the last "trace"
 *    (stage_events.h), encoded by ax_trace_encode.
 *  - "ckpt_save" [dir, name, send (optional i64), async (optional i64),
 *    optim_only (optional i64)]:
 *    writes the stage's state (parameters, buffers, optimizer state and
 *    steps, update position, 2bw's shadow) to dir/name on this agent's
 *    disk (temporary file, fsync, rename; dir is created), or with send =
 *    1 returns the file to the caller instead; [size, sha256 hex] and with
 *    send the file (an i32 tensor of its bytes, zero-padded). With async =
 *    1 (and no send) it answers once the state is copied, and writes the
 *    file in the background ("ckpt_wait" collects the outcome). AX_ESTATE
 *    while a unit is in flight (checkpoints are taken at a consistent
 *    cut). The optimizer state is what its optimizer keeps: its ZeRO
 *    shard with zero, the optimizer host's state with "offload". With
 *    optim_only = 1 the file holds the optimizer state only (holds_params
 *    0: a replica's shard under zero). docs/CHECKPOINTS.md.
 *  - "ckpt_wait" [path]: waits (bounded by the call's deadline) for the
 *    background write of dir/name = path and returns its outcome;
 *    AX_ENOTFOUND when no such write was started.
 *  - "ckpt_load" [path, size, sha256 hex, file (optional)]: the file at
 *    path on this agent, or the one given (path then only names it);
 *    checks it against the manifest's size and checksum and against this
 *    stage (split, mode, tensor-parallel member, optimizer and the range
 *    of its state: its ZeRO shard or all its parameters) and only then
 *    loads it (a file of the optimizer state only: that state; an
 *    optimizer host gets its state); AX_EFORMAT naming the file when it
 *    is damaged, AX_EINVAL when it belongs to another run, replica or
 *    layout.
 *  - "ckpt_drop" [dir, name]: removes that file of an old checkpoint.
 *  - "ckpt_mem_save" [key, peer]: keeps the stage's file (as "ckpt_save"
 *    makes it) in this agent's memory and sends a copy to agent peer
 *    ("axon.pipe.mem_keep"; "" or this agent: no copy), both under the
 *    caller's name and key; [size, sha256 hex]. ax_pipe_checkpoint_memory.
 *  - "ckpt_mem_load" [key, holder, size, sha256 hex]: the caller's copy
 *    under key from agent holder ("axon.pipe.mem_fetch"; this agent's own
 *    memory when it is holder), checked as "ckpt_load" checks a file, then
 *    loaded. The agent-wide store and its "axon.pipe.mem_keep",
 *    "axon.pipe.mem_fetch" and "axon.pipe.mem_forget" are in stage_ckpt_mem.c.
 *  - "offload" [optimizer RRef]: every STEP from now on sends the
 *    (averaged) gradient to that "axon.pipe.optim" object on another agent and
 *    copies the parameters it answers (stage_offload.c; the coordinator
 *    made it and gave it the parameters and the optimizer configuration);
 *    the local optimizer and its state are freed ("setup" makes one
 *    again). The target must be fresh from its "init" (no update yet).
 *    AX_EINVAL with zero (whose replicas each keep a shard of the state).
 *  - "boundary" [op, batch]: the last step boundary, for recovering a
 *    lost replica without a rollback (stage_boundary.c; a flushed mode
 *    with the stage's whole optimizer state, else AX_EINVAL). op 0 (keep):
 *    from now on every STEP first copies the weights, optimizer state and
 *    step count, and every first forward of a batch the buffers, so that
 *    the state at the boundary before the last STEP can be had again. op 1
 *    (stop): ends the stage's actions as "teardown" does (the one running
 *    finishes or fails, the queued ones fail) and drops every unit in
 *    flight, keeping the state. op 2 (rewind, after a stop): back to the
 *    state at boundary `batch` (before its STEP, before its forwards'
 *    statistics): nothing but the buffers when the last step is batch -
 *    1, the kept copy when it is batch; else AX_ESTATE. Replies [last
 *    step, the boundary kept (-1: none)].
 *  - "decode" [session, pos, n, n_in, inputs...]: incremental decoding
 *    (models/module.h, ax_exec.kv_decode): the stage's forward in inference
 *    of n new positions, from position pos, of the sequences of decoding
 *    session `session` (the coordinator's key, >= 0), whose slot tree the
 *    host keeps from the session's first decode (pos 0, which also starts
 *    an existing session anew) until "decode_end": the causal attention
 *    layers keep their keys and values there. pos > 0 must be the positions
 *    the session holds (AX_ESTATE otherwise, and after a failed decode of
 *    it). The inputs are taken and the output pushed as in "fwd", under
 *    the call's context; the last stage answers the logits of each
 *    sequence's last new position (B, vocab, on the CPU). At most 64
 *    sessions per host (AX_ESTATE). Replies [busy_us, cpu_us, sessions,
 *    cache bytes, (logits)]: the sessions the host keeps and the bytes of
 *    their slots after the call.
 *  - "decode_end" [session]: drops the session and its caches (none:
 *    nothing to do); replies as decode, without logits.
 *  - "teardown" []: drops the neighbours' RRefs, every state and every
 *    decoding session (breaks the reference cycle between neighbours; call
 *    before releasing the host). */
#ifndef AX_PIPELINE_STAGE_HOST_H
#define AX_PIPELINE_STAGE_HOST_H

#include "axon/rref/rref.h"

#define AX_PIPE_FLAG_TRAIN 1
#define AX_PIPE_FLAG_RECOMPUTE 2

#endif
