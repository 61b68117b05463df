/* In-memory checkpoints, the coordinator's side (checkpoint.h,
 * ax_pipe_checkpoint_memory), of one pipeline or of every part of a front;
 * the agents' side is stage_ckpt_mem.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/digest.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/ckpt_memory-impl.h"

/* The coordinator's copy of p's frozen prefix (freeze.h) into m. */
static int keep_prefix(ax_pipe *p, ax_mem_ckpt *m) {
  int f = axi_pipe_frozen_blocks(p->frozen);
  m->prefix = NULL;
  m->prefix_blocks = f;
  m->prefix_np = m->prefix_nb = 0;
  if (!f)
    return AX_OK;
  ax_net *net = axi_pipe_frozen_net(p->frozen);
  m->prefix_np = net->n_params;
  m->prefix_nb = net->n_buffers;
  if (!(m->prefix = malloc((m->prefix_np + m->prefix_nb + 1) * sizeof(float))))
    return AX_ENOMEM;
  int err =
      ax_tensor_read(net->params, m->prefix, m->prefix_np * sizeof(float));
  if (err == AX_OK && m->prefix_nb)
    err = ax_tensor_read(net->buffers, m->prefix + m->prefix_np,
                         m->prefix_nb * sizeof(float));
  return err;
}

/* m's frozen prefix into p's (frozen as m's was: the same blocks). */
static int load_prefix(ax_pipe *p, const ax_mem_ckpt *m) {
  int f = axi_pipe_frozen_blocks(p->frozen);
  if (f != m->prefix_blocks || (f && !m->prefix))
    return ax_seterr(AX_EINVAL,
                     "in-memory restore: the checkpoint has %d frozen "
                     "blocks, this pipeline %d (freeze it the same way "
                     "first)",
                     m->prefix_blocks, f);
  if (!f)
    return AX_OK;
  ax_net *net = axi_pipe_frozen_net(p->frozen);
  if (net->n_params != m->prefix_np || net->n_buffers != m->prefix_nb)
    return ax_seterr(AX_EINVAL, "in-memory restore: the frozen prefix's "
                                "sizes differ");
  AX_TRY(ax_tensor_write(net->params, m->prefix, m->prefix_np * sizeof(float)));
  if (m->prefix_nb)
    AX_TRY(ax_tensor_write(net->buffers, m->prefix + m->prefix_np,
                           m->prefix_nb * sizeof(float)));
  axi_pipe_frozen_clear_cache(p->frozen);
  return AX_OK;
}

static int supported(ax_pipe *p, const char *what) {
  for (int i = 0; i < (p->nrep ? p->nrep : 1); i++)
    if ((p->nrep ? p->rep[i] : p)->plan)
      return ax_seterr(AX_ESTATE, "%s: only between ax_pipe_train calls", what);
  return AX_OK;
}

#define AT(m, i, s) (&(m)->st[(size_t)(i) * (size_t)(m)->S + (size_t)(s)])

/* The key of part i's stage s's copies of generation gen: two
 * generations alternate, so a checkpoint that fails half way leaves the
 * previous one whole. */
static void key_of(const ax_mem_ckpt *m, int i, int s, char key[64]) {
  snprintf(key, 64, "%016llx/%02d-stage-%02d.%d", (unsigned long long)m->tag, i,
           s, m->gen);
}

/* The agent that keeps the second copy of part i's stage s: the next
 * stage's agent of the part that is not s's own (cyclic), else the same
 * stage's agent of the next part, else "" (every stage on one agent). */
static const char *peer_of(ax_pipe *const *parts, int n, int i, int s) {
  const ax_pipe *p = parts[i];
  for (int k = 1; k < p->K; k++) {
    const char *a = p->agents[(s + k) % p->K];
    if (strcmp(a, p->agents[s]))
      return a;
  }
  for (int j = 1; j < n; j++) {
    const char *a = parts[(i + j) % n]->agents[s];
    if (strcmp(a, p->agents[s]))
      return a;
  }
  return "";
}

typedef struct mem_args {
  ax_mem_ckpt *m;
  int part;
  const unsigned char *skip; /* [parts S], or NULL */
} mem_args;

static int save_args_of(void *user, int s, ax_values **out) {
  mem_args *a = user;
  *out = NULL;
  if (a->skip && a->skip[a->part * a->m->S + s])
    return AX_OK; /* no copy of this one (axi_pipe_all_stages skips it) */
  char key[64];
  key_of(a->m, a->part, s, key);
  axi_pipe_mem_save_msg m = {key, AT(a->m, a->part, s)->peer};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_mem_save_encode(&m, v) : AX_ENOMEM;
}

static int save_reply(void *user, int s, const ax_values *r) {
  mem_args *a = user;
  axi_pipe_file_msg m; /* size >= 0, a checksum of the right length */
  AX_TRY(axi_pipe_file_decode(r, &m));
  AT(a->m, a->part, s)->size = m.size;
  snprintf(AT(a->m, a->part, s)->sha, sizeof AT(a->m, 0, 0)->sha, "%s", m.sha);
  return AX_OK;
}

static uint64_t incarnation(ax_node *n, const char *name) {
  uint64_t inc = 0;
  if (*name && ax_node_member_incarnation(n, name, &inc) != AX_OK)
    inc = 0;
  return inc;
}

int axi_pipe_mem_take(ax_pipe *p, const ax_ckpt_info *info,
                      const ax_mem_ckpt *prev, int gen, int peers,
                      const unsigned char *skip, ax_mem_ckpt *out) {
  AX_TRY(supported(p, "in-memory checkpoint"));
  ax_pipe *const *parts = p->nrep ? p->rep : &p; /* a front's, or p */
  int n = p->nrep ? p->nrep : 1, S = parts[0]->K;
  if ((size_t)n * (size_t)S > AX_MEM_CKPT_COPIES)
    return ax_seterr(AX_EINVAL, "in-memory checkpoint: %d parts of %d stages",
                     n, S);
  ax_mem_ckpt *m = calloc(1, sizeof *m);
  if (!m)
    return AX_ENOMEM;
  m->info = *info;
  m->gen = gen;
  /* The run's own keys: another pipeline of this coordinator on the same
   * agents keeps its copies apart. */
  static uint64_t runs;
  m->tag = prev && prev->S > 0
               ? prev->tag
               : ax_node_incarnation(p->node) ^
                     (__atomic_add_fetch(&runs, 1, __ATOMIC_RELAXED) << 48);
  m->mode = parts[0]->o.mode;
  m->S = S;
  m->U = parts[0]->U;
  m->parts = n;
  m->members = axi_pipe_members(p);
  for (int i = 0; i < n; i++)
    for (int s = 0; s < S; s++) {
      if (skip && skip[i * S + s])
        continue;
      snprintf(AT(m, i, s)->agent, 64, "%s", parts[i]->agents[s]);
      snprintf(AT(m, i, s)->peer, 64, "%s",
               peers ? peer_of(parts, n, i, s) : "");
      AT(m, i, s)->agent_inc = incarnation(p->node, AT(m, i, s)->agent);
      AT(m, i, s)->peer_inc = incarnation(p->node, AT(m, i, s)->peer);
    }
  int err = AX_OK;
  for (int i = 0; i < n && err == AX_OK; i++) {
    mem_args a = {m, i, skip};
    err = axi_pipe_all_stages(parts[i], 0, "ckpt_mem_save", save_args_of,
                              save_reply, &a);
  }
  if (err == AX_OK)
    err = keep_prefix(p, m);
  if (err == AX_OK) { /* a failed one leaves *out, the last complete one */
    free(out->prefix);
    *out = *m;
  } else {
    free(m->prefix);
  }
  free(m);
  return err;
}

int ax_pipe_checkpoint_memory(ax_pipe *p, const ax_ckpt_info *info,
                              ax_mem_ckpt *out) {
  return axi_pipe_mem_take(p, info, out, out->S > 0 ? !out->gen : 0, 1, NULL,
                           out);
}

/* Where one copy of part i's stage s is now: its agent's if that is still
 * the process that kept it, else its neighbour's; NULL when both are
 * gone. */
static const char *holder_of(ax_node *n, const ax_mem_ckpt *m, int i, int s) {
  const char *who[2] = {AT(m, i, s)->agent, AT(m, i, s)->peer};
  uint64_t inc[2] = {AT(m, i, s)->agent_inc, AT(m, i, s)->peer_inc};
  for (int k = 0; k < 2; k++)
    if (*who[k] && ax_node_member_alive_as(n, who[k], inc[k]))
      return who[k];
  return NULL;
}

typedef struct load_args {
  const ax_mem_ckpt *m;
  const char *holder[AX_PIPE_MAX_STAGES];
  int from[AX_PIPE_MAX_STAGES]; /* the part whose copy stage s loads */
} load_args;

static int load_args_of(void *user, int s, ax_values **out) {
  load_args *a = user;
  char key[64];
  key_of(a->m, a->from[s], s, key);
  axi_pipe_mem_load_msg m = {key, a->holder[s], AT(a->m, a->from[s], s)->size,
                             AT(a->m, a->from[s], s)->sha};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_mem_load_encode(&m, v) : AX_ENOMEM;
}

/* Where part i's stage s (held by agent `at`) loads from: the copy kept
 * by `at` itself, else part i's own copies, else those of the same stage
 * of the same member of another replica (the same state; the
 * checkpoint's replicas may be more or fewer than p's). */
static int find_copy(ax_node *n, const ax_mem_ckpt *m, int i, int s,
                     const char *at, load_args *a) {
  int T = m->members, R = m->parts / T;
  for (int k = 0; k < R; k++) { /* a copy on this stage's own agent */
    int j = k * T + i % T;
    if (!strcmp(AT(m, j, s)->agent, at) &&
        (a->holder[s] = holder_of(n, m, j, s)) && !strcmp(a->holder[s], at)) {
      a->from[s] = j;
      return AX_OK;
    }
  }
  for (int k = 0; k < R; k++) {
    int j = (i + k * T) % m->parts; /* replica (i / T + k) mod R, member */
    if ((a->holder[s] = holder_of(n, m, j, s))) {
      a->from[s] = j;
      return AX_OK;
    }
  }
  if (m->parts == 1)
    return ax_seterr(AX_ENOTFOUND,
                     "in-memory restore: stage %d's copies "
                     "were on %s and %s, both lost (restore from disk)",
                     s, AT(m, 0, s)->agent,
                     *AT(m, 0, s)->peer ? AT(m, 0, s)->peer : "-");
  return ax_seterr(AX_ENOTFOUND,
                   "in-memory restore: every copy of stage %d of member %d "
                   "is lost (its agents and its neighbours' in all %d "
                   "replicas; restore from disk)",
                   s, i % T, R);
}

int ax_pipe_restore_memory(ax_pipe *p, const ax_mem_ckpt *m,
                           ax_ckpt_info *info) {
  AX_TRY(supported(p, "in-memory restore"));
  if (m->S < 1)
    return ax_seterr(AX_ENOTFOUND, "in-memory restore: no checkpoint taken");
  ax_pipe *const *parts = p->nrep ? p->rep : &p; /* a front's, or p */
  int n = p->nrep ? p->nrep : 1;
  if (m->mode != parts[0]->o.mode || m->S != parts[0]->K ||
      m->U != parts[0]->U || m->members != axi_pipe_members(p))
    return ax_seterr(AX_EINVAL,
                     "in-memory restore: the checkpoint is of %s "
                     "with %d stages, %d units and %d tensor-parallel "
                     "members, this pipeline %s with %d, %d and %d",
                     ax_pipe_mode_name(m->mode), m->S, m->U, m->members,
                     ax_pipe_mode_name(parts[0]->o.mode), parts[0]->K,
                     parts[0]->U, axi_pipe_members(p));
  AX_TRY(load_prefix(p, m));
  load_args *a = calloc((size_t)n, sizeof *a);
  if (!a)
    return AX_ENOMEM;
  int err = AX_OK;
  for (int i = 0; i < n && err == AX_OK; i++) {
    a[i].m = m;
    for (int s = 0; s < m->S && err == AX_OK; s++)
      err = find_copy(p->node, m, i % m->parts, s, parts[i]->agents[s], &a[i]);
  }
  int i = 0, T = m->members;
  for (; i < n && err == AX_OK; i++)
    err = axi_pipe_all_stages(parts[i], 0, "ckpt_mem_load", load_args_of, NULL,
                              &a[i]);
  free(a);
  if (err != AX_OK && n > 1 && T > 1)
    return ax_seterr(err, "replica %d member %d: %s", (i - 1) / T, (i - 1) % T,
                     ax_errmsg());
  if (err != AX_OK && n > 1)
    return ax_seterr(err, "replica %d: %s", i - 1, ax_errmsg());
  AX_TRY(err);
  for (int i = 0; i < n; i++)
    parts[i]->base = m->info.step;
  if (info)
    *info = m->info;
  return AX_OK;
}

void ax_pipe_memory_forget(ax_pipe *p, ax_mem_ckpt *m) {
  free(m->prefix);
  m->prefix = NULL;
  ax_node *n = p->node;
  ax_call_opts o = {.timeout_ms = 2000};
  int total = m->S * (m->parts > 0 ? m->parts : 1);
  for (int c = 0; c < total; c++) {
    const char *who[2] = {m->st[c].agent, m->st[c].peer};
    for (int i = 0; i < 2; i++) {
      int seen = !*who[i] || ax_node_peer_is_down(n, who[i]);
      for (int d = 0; d < c && !seen; d++) /* each agent once */
        seen =
            !strcmp(m->st[d].agent, who[i]) || !strcmp(m->st[d].peer, who[i]);
      for (int j = 0; j < i && !seen; j++)
        seen = !strcmp(who[j], who[i]);
      ax_values *none = seen ? NULL : ax_values_new();
      if (none && axi_pipe_mem_forget_encode(none) == AX_OK)
        ax_rpc_sync(n, who[i], "axon.pipe.mem_forget", none, &o, NULL);
      ax_values_free(none);
    }
  }
}
