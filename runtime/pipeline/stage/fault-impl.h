/* Faults at named points, for tests only (docs/TESTBED.md): the environment
 * variable AXON_FAULT makes a process that hosts pipeline stages die with
 * _exit, as a crash would (no clean shutdown, no reply), when one of its
 * stages reaches a named point. Unset, every hook returns at once.
 *
 * The value is one fault or several separated by ';', each a list of
 * comma-separated items:
 *
 *   action=F|B|I|W|STEP  the start of that action (F forward, B backward,
 *                        I and W its halves, STEP the update, fused into
 *                        a B or not) of a training unit
 *   ckpt-write           the writing of a stage's checkpoint file: half
 *                        of it is in NAME.tmp when the process dies
 *   handoff              a stage's state moving to a (new) agent: a stage
 *                        loading a checkpoint file or an in-memory copy,
 *                        or an agent handing its in-memory copy over
 *   agent=NAME           only the node named NAME (a process that hosts
 *                        several nodes, or the --local agents of axon-run,
 *                        which all inherit its environment)
 *   stage=S              only stage S (its index in the pipeline; with
 *                        chunks, the index among all K v stages)
 *   unit=U               only unit U (F, B, I and W): a micro-batch
 *   step=N               only mini-batch N (actions), or the checkpoint of
 *                        step N (ckpt-write: its directory ckpt-NNNNNNNN)
 *
 * Exactly one of action=, ckpt-write and handoff per fault; a fault without
 * a filter fires the first time its point is reached. Example:
 * AXON_FAULT='agent=stage1,stage=1,action=B,unit=3,step=5;agent=spare0,handoff'
 * (stage1 dies at the backward of unit 3 of mini-batch 5; the spare that
 * takes its place dies loading the checkpoint).
 *
 * Before dying the process writes one line to stderr, "axon fault: NODE dies
 * at POINT (AXON_FAULT)", and exits with status AXI_PIPE_FAULT_STATUS.
 * Thread-safe: the value is read once, then only read. */
#ifndef AX_PIPELINE_STAGE_FAULT_IMPL_H
#define AX_PIPELINE_STAGE_FAULT_IMPL_H

#include <stddef.h>

#include "axon/rpc/node.h"

#define AXI_PIPE_FAULT_STATUS 86

typedef enum axi_pipe_fault_act {
  AXI_PIPE_FAULT_F,
  AXI_PIPE_FAULT_B,
  AXI_PIPE_FAULT_I,
  AXI_PIPE_FAULT_W,
  AXI_PIPE_FAULT_STEP,
} axi_pipe_fault_act;

/* Reads AXON_FAULT (the first call; later ones return the same outcome):
 * AX_OK when it is unset or well formed, else AX_EINVAL naming the bad
 * item. The stage host's registration calls it, so that an agent refuses
 * to start with a malformed value. */
int axi_pipe_fault_init(void);

/* The hooks: the process dies here when a fault matches. n: the node of
 * the stage; stage: its index. */
/* Action act of unit `unit` (-1 for STEP) of mini-batch `step`; a negative
 * step (an evaluation) never matches. */
void axi_pipe_fault_action(ax_node *n, int stage, axi_pipe_fault_act act,
                           long step, long unit);
/* Before stage's file path is written (buf, len bytes). */
void axi_pipe_fault_ckpt_write(ax_node *n, int stage, const char *path,
                               const void *buf, size_t len);
/* Stage's state moves here (a load) or from here (an in-memory copy
 * handed over); stage < 0: read from key's "stage-NN" (an in-memory
 * copy's key), NULL or without one: matches only faults without stage=. */
void axi_pipe_fault_handoff(ax_node *n, int stage, const char *key);

#endif
