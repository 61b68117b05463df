/* Samples of every typed stage message
 * (runtime/pipeline/stage/stage_msg-impl.h), shared by tests/test_stage_msg.c
 * and the fuzz seeds (tests/fuzz/fuzz_seeds.c). Header-only. */
#ifndef AX_TESTS_STAGE_MSG_SAMPLES_H
#define AX_TESTS_STAGE_MSG_SAMPLES_H

#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

#define SM_SHA                                                                 \
  "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* A buffer for any message's struct. */
typedef union sm_any {
  unsigned char b[AXP_MSG_MAX];
  int64_t align_i;
  double align_d;
  void *align_p;
} sm_any;

static int sm_is(int id, const char *name) {
  return !strcmp(axi_pipe_msg_name(id), name);
}

/* The sample of message id into p (its struct): every optional part
 * present (full), or none (and a push without tensors), with the tensors t
 * and the RRef r. */
static void sm_sample(int id, void *p, int full, ax_tensor *const t[3],
                      ax_rref *r) {
  memset(p, 0, axi_pipe_msg_size(id));
  if (sm_is(id, "axon.pipe.stage setup")) {
    axi_pipe_setup_msg *m = p;
    *m = (axi_pipe_setup_msg){2, 1, "opt=sgd,lr=0.1", r, NULL, 77, 1};
    m->has_stale = m->has_replicas = m->has_zero = m->has_tp = full;
    m->has_ties = full;
    m->stale = 1, m->delay = 3, m->gamma = 0.5, m->warmup = 2;
    m->replicas = (axi_pipe_group){2, 1, "pp1", {"a", "b"}};
    m->zero = 1;
    m->tp = (axi_pipe_group){3, 2, "tp1", {"c", "d", "e"}};
    m->has_precision = full;
    m->precision = 1;
    m->ties.n = 2;
    m->ties.t[0] = (axi_pipe_tie){0, {2, 1, "ti1", {"a", "c"}}};
    m->ties.t[1] = (axi_pipe_tie){3, {2, 0, "ti2", {"c", "c"}}};
  } else if (sm_is(id, "axon.pipe.stage fwd")) {
    axi_pipe_fwd_msg *m = p;
    *m = (axi_pipe_fwd_msg){5, 3, -9, 3, {1, {t[0]}}, full};
    m->lab = (axi_pipe_labels){{2, {t[1], t[2]}}, {4, 0}};
    m->has_scale = full;
    m->scale = 0.75;
  } else if (sm_is(id, "axon.pipe.stage bwd") ||
             sm_is(id, "axon.pipe.stage bwdw")) {
    *(axi_pipe_bwd_msg *)p = (axi_pipe_bwd_msg){6, 1, 1, 4};
  } else if (sm_is(id, "axon.pipe.stage bwdi")) {
    *(axi_pipe_bwdi_msg *)p = (axi_pipe_bwdi_msg){6, 2};
  } else if (sm_is(id, "axon.pipe.stage step")) {
    *(axi_pipe_step_msg *)p = (axi_pipe_step_msg){6, 4};
  } else if (sm_is(id, "stage report")) {
    *(axi_pipe_report_msg *)p =
        (axi_pipe_report_msg){120, 90, 2, 3, 4096, full, 0.25, 7, 8};
  } else if (sm_is(id, "axon.pipe.stage offload")) {
    ((axi_pipe_offload_msg *)p)->optim = r;
  } else if (sm_is(id, "axon.pipe.stage state_save reply")) {
    *(axi_pipe_state_msg *)p = (axi_pipe_state_msg){t[0], t[1]};
  } else if (sm_is(id, "axon.pipe.stage trace reply")) {
    ((axi_pipe_trace_msg *)p)->events = (axi_pipe_bytes){"events", 6};
  } else if (sm_is(id, "axon.pipe.stage ckpt_save")) {
    *(axi_pipe_ckpt_save_msg *)p = (axi_pipe_ckpt_save_msg){
        "dir", "stage-00.axck", full, 1, full, 0, full, 1};
  } else if (sm_is(id, "axon.pipe.stage ckpt_wait")) {
    ((axi_pipe_ckpt_wait_msg *)p)->path = "dir/stage-00.axck";
  } else if (sm_is(id, "checkpoint file reply")) {
    *(axi_pipe_file_msg *)p = (axi_pipe_file_msg){100, SM_SHA, full, t[2]};
  } else if (sm_is(id, "axon.pipe.stage ckpt_load")) {
    *(axi_pipe_ckpt_load_msg *)p =
        (axi_pipe_ckpt_load_msg){"p", 100, SM_SHA, full, t[2]};
  } else if (sm_is(id, "axon.pipe.stage ckpt_mem_save")) {
    *(axi_pipe_mem_save_msg *)p = (axi_pipe_mem_save_msg){"key", "peer"};
  } else if (sm_is(id, "axon.pipe.stage ckpt_mem_load")) {
    *(axi_pipe_mem_load_msg *)p =
        (axi_pipe_mem_load_msg){"key", "holder", 100, SM_SHA};
  } else if (sm_is(id, "axon.pipe.mem_keep")) {
    *(axi_pipe_mem_keep_msg *)p =
        (axi_pipe_mem_keep_msg){"owner", "key", 100, SM_SHA, t[2]};
  } else if (sm_is(id, "axon.pipe.mem_fetch")) {
    *(axi_pipe_mem_fetch_msg *)p = (axi_pipe_mem_fetch_msg){"owner", "key"};
  } else if (sm_is(id, "axon.pipe.optim init")) {
    *(axi_pipe_optim_init_msg *)p = (axi_pipe_optim_init_msg){"opt=sgd", t[0]};
  } else if (sm_is(id, "axon.pipe.optim step")) {
    *(axi_pipe_optim_step_msg *)p = (axi_pipe_optim_step_msg){t[0], 0.25};
  } else if (sm_is(id, "axon.pipe.optim step reply")) {
    ((axi_pipe_optim_reply_msg *)p)->params = t[1];
  } else if (sm_is(id, "axon.pipe.optim state")) {
    *(axi_pipe_optim_state_msg *)p =
        (axi_pipe_optim_state_msg){t[0], t[1], 12, full, t[0]};
  } else if (sm_is(id, "axon.pipe.stage boundary")) {
    *(axi_pipe_boundary_msg *)p =
        (axi_pipe_boundary_msg){AXP_BOUNDARY_REWIND, 7};
  } else if (sm_is(id, "axon.pipe.stage boundary reply")) {
    *(axi_pipe_boundary_reply_msg *)p = (axi_pipe_boundary_reply_msg){6, -1};
  } else if (sm_is(id, "axon.pipe.stage decode")) {
    *(axi_pipe_decode_msg *)p = (axi_pipe_decode_msg){9, 12, 1, {1, {t[0]}}};
  } else if (sm_is(id, "axon.pipe.stage decode_end")) {
    ((axi_pipe_decode_end_msg *)p)->session = 5;
  } else if (sm_is(id, "axon.pipe.stage decode reply")) {
    *(axi_pipe_decode_reply_msg *)p =
        (axi_pipe_decode_reply_msg){30, 20, 2, 1024, full, t[1]};
  } else if (!sm_is(id, "axon.pipe.mem_forget") &&
             !sm_is(id, "axon.pipe.stage settle")) {
    abort(); /* a message without a sample */
  }
}

#endif
