/* In-memory checkpoints, the coordinator's side (checkpoint.h,
 * ax_pipe_checkpoint_memory); the agents' side is stage_ckpt_mem.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/digest.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/checkpoint.h"

static int plain(const ax_pipe *p, const char *what) {
  if (p->nrep || p->members > 1 || p->frozen || p->o.zero || p->optim_host[0])
    return ax_seterr(AX_EUNSUPPORTED,
                     "%s: only of a plain pipeline (no "
                     "replicas, tensor parallelism, freezing, zero or "
                     "optimizer host)",
                     what);
  if (p->plan)
    return ax_seterr(AX_ESTATE, "%s: only between ax_pipe_train calls", what);
  return AX_OK;
}

/* The key of stage s's copies of generation gen: two generations
 * alternate, so a checkpoint that fails half way leaves the previous one
 * whole. */
static void key_of(const ax_mem_ckpt *m, int s, char key[64]) {
  snprintf(key, 64, "%016llx/stage-%02d.%d", (unsigned long long)m->tag, s,
           m->gen);
}

/* The agent that keeps stage s's second copy: the next stage's agent that
 * is not s's own (cyclic), or "" when every stage is on one agent. */
static const char *peer_of(const ax_pipe *p, int s) {
  for (int i = 1; i < p->K; i++) {
    const char *a = p->agents[(s + i) % p->K];
    if (strcmp(a, p->agents[s]))
      return a;
  }
  return "";
}

typedef struct mem_args {
  ax_pipe *p;
  ax_mem_ckpt *m;
} mem_args;

static int save_args_of(void *user, int s, ax_values **out) {
  mem_args *a = user;
  char key[64];
  key_of(a->m, s, key);
  axi_pipe_mem_save_msg m = {key, a->m->st[s].peer};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_mem_save_encode(&m, v) : AX_ENOMEM;
}

static int save_reply(void *user, int s, const ax_values *r) {
  mem_args *a = user;
  axi_pipe_file_msg m; /* size >= 0, a checksum of the right length */
  AX_TRY(axi_pipe_file_decode(r, &m));
  a->m->st[s].size = m.size;
  snprintf(a->m->st[s].sha, sizeof a->m->st[s].sha, "%s", m.sha);
  return AX_OK;
}

static uint64_t incarnation(ax_node *n, const char *name) {
  uint64_t inc = 0;
  if (*name && ax_node_member_incarnation(n, name, &inc) != AX_OK)
    inc = 0;
  return inc;
}

int ax_pipe_checkpoint_memory(ax_pipe *p, const ax_ckpt_info *info,
                              ax_mem_ckpt *out) {
  AX_TRY(plain(p, "in-memory checkpoint"));
  ax_mem_ckpt *m = calloc(1, sizeof *m);
  if (!m)
    return AX_ENOMEM;
  m->info = *info;
  m->gen = out->S > 0 ? !out->gen : 0;
  /* The run's own keys: another pipeline of this coordinator on the same
   * agents keeps its copies apart. */
  static uint64_t runs;
  m->tag = out->S > 0
               ? out->tag
               : ax_node_incarnation(p->node) ^
                     (__atomic_add_fetch(&runs, 1, __ATOMIC_RELAXED) << 48);
  m->mode = p->o.mode;
  m->S = p->K;
  m->U = p->U;
  for (int s = 0; s < p->K; s++) {
    snprintf(m->st[s].agent, sizeof m->st[s].agent, "%s", p->agents[s]);
    snprintf(m->st[s].peer, sizeof m->st[s].peer, "%s", peer_of(p, s));
    m->st[s].agent_inc = incarnation(p->node, m->st[s].agent);
    m->st[s].peer_inc = incarnation(p->node, m->st[s].peer);
  }
  mem_args a = {p, m};
  int err =
      axi_pipe_all_stages(p, 0, "ckpt_mem_save", save_args_of, save_reply, &a);
  if (err == AX_OK)
    *out = *m; /* a failed one leaves *out, the last complete one, as it was */
  free(m);
  return err;
}

/* Where stage s's copy is now: its agent's if that is still the process
 * that kept it, else its neighbour's; NULL when both are gone. */
static const char *holder_of(ax_node *n, const ax_mem_ckpt *m, int s) {
  const char *who[2] = {m->st[s].agent, m->st[s].peer};
  uint64_t inc[2] = {m->st[s].agent_inc, m->st[s].peer_inc};
  for (int i = 0; i < 2; i++)
    if (*who[i] && ax_node_member_alive_as(n, who[i], inc[i]))
      return who[i];
  return NULL;
}

typedef struct load_args {
  const ax_mem_ckpt *m;
  const char *holder[AX_PIPE_MAX_STAGES];
} load_args;

static int load_args_of(void *user, int s, ax_values **out) {
  load_args *a = user;
  char key[64];
  key_of(a->m, s, key);
  axi_pipe_mem_load_msg m = {key, a->holder[s], a->m->st[s].size,
                             a->m->st[s].sha};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_mem_load_encode(&m, v) : AX_ENOMEM;
}

int ax_pipe_restore_memory(ax_pipe *p, const ax_mem_ckpt *m,
                           ax_ckpt_info *info) {
  AX_TRY(plain(p, "in-memory restore"));
  if (m->S < 1)
    return ax_seterr(AX_ENOTFOUND, "in-memory restore: no checkpoint taken");
  if (m->mode != p->o.mode || m->S != p->K || m->U != p->U)
    return ax_seterr(AX_EINVAL,
                     "in-memory restore: the checkpoint is of %s "
                     "with %d stages and %d units, this pipeline %s with %d "
                     "and %d",
                     ax_pipe_mode_name(m->mode), m->S, m->U,
                     ax_pipe_mode_name(p->o.mode), p->K, p->U);
  load_args a = {m, {NULL}};
  for (int s = 0; s < p->K; s++)
    if (!(a.holder[s] = holder_of(p->node, m, s)))
      return ax_seterr(AX_ENOTFOUND,
                       "in-memory restore: stage %d's copies "
                       "were on %s and %s, both lost (restore from disk)",
                       s, m->st[s].agent, *m->st[s].peer ? m->st[s].peer : "-");
  AX_TRY(axi_pipe_all_stages(p, 0, "ckpt_mem_load", load_args_of, NULL, &a));
  p->base = m->info.step;
  if (info)
    *info = m->info;
  return AX_OK;
}

void ax_pipe_memory_forget(ax_pipe *p, const ax_mem_ckpt *m) {
  ax_node *n = p->node;
  ax_call_opts o = {.timeout_ms = 2000};
  for (int s = 0; s < m->S; s++) {
    const char *who[2] = {m->st[s].agent, m->st[s].peer};
    for (int i = 0; i < 2; i++) {
      int seen = !*who[i] || ax_node_peer_is_down(n, who[i]);
      for (int t = 0; t < s && !seen; t++) /* each agent once */
        seen =
            !strcmp(m->st[t].agent, who[i]) || !strcmp(m->st[t].peer, who[i]);
      for (int j = 0; j < i && !seen; j++)
        seen = !strcmp(who[j], who[i]);
      ax_values *none = seen ? NULL : ax_values_new();
      if (none && axi_pipe_mem_forget_encode(none) == AX_OK)
        ax_rpc_sync(n, who[i], "axon.pipe.mem_forget", none, &o, NULL);
      ax_values_free(none);
    }
  }
}
