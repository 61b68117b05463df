/* The V modes' action generators and bounds (mode_v.c), for the mode
 * table (mode.c). Rank r of K holds the V's two stages: r on the way down
 * (its first arm) and 2K - 1 - r on the way back (its second arm).
 *
 * The generators have the table's signature (ax_pipe_mode_def.actions):
 * rank r's list for n mini-batches of U units at out[*k...], one
 * mini-batch's order repeated, each ending with the STEPs of the rank's two
 * stages. The live bounds take the table's (S, s, U) with S = 2K stages:
 * the most units stage s keeps at once, counted on its rank's list (exact:
 * a unit is live from its F to its B or W, and the list's order fixes
 * that count whatever the timing). Internal to runtime/pipeline/schedule/;
 * reentrant. */
#ifndef AX_PIPELINE_MODE_V_H
#define AX_PIPELINE_MODE_V_H

#include "axon/runtime/pipeline/schedule/mode.h"

/* Copies one mini-batch's list `one` (len actions, batch 0) n times with
 * batch t at out[*k...], each copy followed by STEP of stage r and of
 * stage 2K - 1 - r (zbv's and the V modes' flush). */
void axi_vmode_repeat(const ax_pipe_op *one, long len, int K, int r, long n,
                      ax_pipe_op *out, long *k);

/* DualPipeV (needs U >= 2K): F and B of two units as one composite
 * action, I and W where a W fills a wait. */
void axi_vmode_act_dualpipev(int K, int v, int r, int U, long n,
                             ax_pipe_op *out, long *k);
/* Its W actions per mini-batch on rank r: 2K - 1 - r. */
int axi_vmode_weight_halves_dualpipev(int K, int r, int U);
int axi_vmode_live_dualpipev(int S, int s, int U);

/* V-Half and V-Min (any U >= 1): the controllable-memory building blocks,
 * I and W. */
void axi_vmode_act_vhalf(int K, int v, int r, int U, long n, ax_pipe_op *out,
                         long *k);
void axi_vmode_act_vmin(int K, int v, int r, int U, long n, ax_pipe_op *out,
                        long *k);
int axi_vmode_live_vhalf(int S, int s, int U);
int axi_vmode_live_vmin(int S, int s, int U);

#endif
