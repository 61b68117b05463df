/* Freezing and re-packing (freeze.h): the old pipeline's stage states are
 * gathered in the checkpoint file format (each stage's "ckpt_save", sent
 * back), joined block after block, cut at the new split and loaded into
 * the new pipeline's stages ("ckpt_load" with the file), which check them
 * as they check a checkpoint. The frozen blocks become the prefix net on
 * the coordinator (freeze_cache.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/model.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "axon/runtime/pipeline/state/freeze.h"

/* One float record of every stage, joined in block order. */
typedef struct joined {
  float *v;
  size_t n;
} joined;

enum { J_PARAMS, J_BUFFERS, J_M, J_V, J_SHADOW, J_N };
static const char *const g_rec[J_N] = {"params", "buffers", "optim.m",
                                       "optim.v", "shadow"};

typedef struct gathered {
  joined j[J_N];
  int64_t kind, steps, last_step, shadow_for;
} gathered;

static void gathered_free(gathered *g) {
  for (int i = 0; i < J_N; i++)
    free(g->j[i].v);
  memset(g, 0, sizeof *g);
}

static int append(joined *j, const axi_ckr *r, const char *name) {
  const uint8_t *d;
  size_t k;
  AX_TRY(axi_ckr_f32(r, name, &d, &k));
  float *v = realloc(j->v, (j->n + k + 1) * sizeof *v);
  if (!v)
    return AX_ENOMEM;
  memcpy(v + j->n, d, k * sizeof *v);
  j->v = v;
  j->n += k;
  return AX_OK;
}

/* Stage files in transit (axi_ck_pack), their sizes and checksums: the
 * old stages' (they answer in any order: kept, then joined) and the new
 * ones'. */
typedef struct stage_files {
  ax_tensor *file[AX_PIPE_MAX_STAGES];
  int64_t size[AX_PIPE_MAX_STAGES];
  char sha[AX_PIPE_MAX_STAGES][2 * AX_SHA256_LEN + 1];
} stage_files;

static void stage_files_free(stage_files *a) {
  for (int s = 0; s < AX_PIPE_MAX_STAGES; s++)
    ax_tensor_release(a->file[s]);
}

static int gather_args_of(void *user, int s, ax_values **out) {
  char name[32];
  snprintf(name, sizeof name, "stage-%02d.axck", s);
  axi_pipe_ckpt_save_msg m = {"freeze", name, 1, 1}; /* send it back */
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_ckpt_save_encode(&m, v) : AX_ENOMEM;
}

static int gather_reply(void *user, int s, const ax_values *r) {
  stage_files *a = user;
  axi_pipe_file_msg m; /* size >= 0, a checksum of the right length */
  AX_TRY(axi_pipe_file_decode(r, &m));
  if (!m.has_file)
    return ax_seterr(AX_EMALFORMED, "freeze: stage %d sent no file", s);
  a->size[s] = m.size;
  snprintf(a->sha[s], sizeof a->sha[s], "%s", m.sha);
  a->file[s] = ax_tensor_retain(m.file);
  return AX_OK;
}

/* Every stage's state, joined; the scalars must agree across stages. */
static int gather(ax_pipe *one, gathered *g) {
  stage_files a;
  memset(&a, 0, sizeof a);
  memset(g, 0, sizeof *g);
  int err = axi_pipe_all_stages(one, 0, "ckpt_save", gather_args_of,
                                gather_reply, &a);
  for (int s = 0; s < one->K && err == AX_OK; s++) {
    uint8_t *buf = NULL;
    size_t len = (size_t)a.size[s];
    axi_ckr r;
    char name[64];
    snprintf(name, sizeof name, "state of stage %d", s);
    err = a.file[s] ? axi_ck_unpack(a.file[s], len, &buf) : AX_EINTERNAL;
    if (err == AX_OK) /* takes buf */
      err = axi_ckr_mem(&r, name, buf, len, AXI_CK_STAGE, a.size[s], a.sha[s]);
    if (err != AX_OK)
      break;
    int64_t v[4];
    const char *keys[4] = {"optim.kind", "optim.steps", "last_step",
                           "shadow_for"};
    for (int i = 0; i < 4 && err == AX_OK; i++)
      err = axi_ckr_i64(&r, keys[i], &v[i]);
    if (err == AX_OK && s == 0) {
      g->kind = v[0], g->steps = v[1], g->last_step = v[2];
      g->shadow_for = v[3];
    } else if (err == AX_OK &&
               (v[0] != g->kind || v[1] != g->steps || v[2] != g->last_step ||
                v[3] != g->shadow_for)) {
      err = ax_seterr(AX_ESTATE,
                      "freeze: stage %d is at another update "
                      "than stage 0 (not a consistent cut)",
                      s);
    }
    for (int i = 0; i < J_N && err == AX_OK; i++)
      err = append(&g->j[i], &r, g_rec[i]);
    axi_ckr_close(&r);
  }
  stage_files_free(&a);
  if (err != AX_OK)
    gathered_free(g);
  return err;
}

/* Parameters and buffers of each block of the model. */
static int block_sizes(const ax_model_def *def, const ax_config *cfg, int n,
                       size_t *np, size_t *nb) {
  for (int i = 0; i < n; i++) {
    ax_module *m = NULL;
    AX_TRY(def->build_block(cfg, i, &m));
    ax_module_layout(m, 0, 0, &np[i], &nb[i]);
    ax_module_free(m);
  }
  return AX_OK;
}

/* ---- the new stages' files ----------------------------------------------- */

static int load_args_of(void *user, int s, ax_values **out) {
  stage_files *a = user;
  axi_pipe_ckpt_load_msg m = {"freeze", a->size[s], a->sha[s], 1, a->file[s]};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_ckpt_load_encode(&m, v) : AX_ENOMEM;
}

/* Stage s of the new split: blocks [b0, b1) of the joined state, whose
 * block `base` starts at offset 0 (pa/ba: each block's first parameter and
 * buffer offsets in the joined state). */
static int stage_file(const gathered *g, int mode, int s, int b0, int b1,
                      const size_t *pa, const size_t *ba, stage_files *a) {
  axi_ckw w;
  axi_ckw_init(&w, AXI_CK_STAGE);
  axi_ckw_i64(&w, "stage", s);
  axi_ckw_i64(&w, "blocks.first", b0);
  axi_ckw_i64(&w, "blocks.last", b1);
  axi_ckw_i64(&w, "mode", mode);
  for (int i = 0; i < J_N; i++) { /* absent records stay empty */
    const joined *j = &g->j[i];
    const size_t *off = i == J_BUFFERS ? ba : pa;
    axi_ckw_f32(&w, g_rec[i], j->n ? j->v + off[b0] : NULL,
                j->n ? off[b1] - off[b0] : 0);
  }
  axi_ckw_i64(&w, "optim.kind", g->kind);
  axi_ckw_i64(&w, "optim.steps", g->steps);
  axi_ckw_i64(&w, "last_step", g->last_step);
  axi_ckw_i64(&w, "shadow_for", g->shadow_for);
  uint8_t *buf = NULL;
  size_t len = 0;
  AX_TRY(axi_ckw_finish(&w, &buf, &len, a->sha[s]));
  a->file[s] = axi_ck_pack(buf, len);
  a->size[s] = (int64_t)len;
  free(buf);
  return a->file[s] ? AX_OK : AX_ENOMEM;
}

/* ---- the frozen prefix --------------------------------------------------- */

/* Blocks [0, f) on the coordinator's CPU: the old prefix's values, then
 * blocks [f_old, f) of the joined state. */
static int prefix_net(const ax_model_def *def, const ax_config *cfg,
                      uint64_t seed, axi_pipe_frozen *old, int f_old, int f,
                      const gathered *g, const size_t *pa, const size_t *ba,
                      ax_net **out) {
  ax_net *net = NULL;
  AX_TRY(ax_model_stage(def, cfg, 0, f, AX_CPU, seed, &net));
  size_t op = 0, ob = 0;
  if (old) {
    ax_net *o = axi_pipe_frozen_net(old);
    op = o->n_params, ob = o->n_buffers;
    memcpy(net->params->data, o->params->data, op * sizeof(float));
    if (ob)
      memcpy(net->buffers->data, o->buffers->data, ob * sizeof(float));
  }
  size_t np = pa[f] - pa[f_old], nb = ba[f] - ba[f_old];
  if (op + np != net->n_params || ob + nb != net->n_buffers) {
    ax_net_free(net);
    return ax_seterr(AX_EINTERNAL,
                     "freeze: the prefix has %zu parameters, "
                     "the joined state %zu",
                     net->n_params, op + np);
  }
  memcpy(ax_f32(net->params) + op, g->j[J_PARAMS].v + pa[f_old],
         np * sizeof(float));
  if (nb)
    memcpy(ax_f32(net->buffers) + ob, g->j[J_BUFFERS].v + ba[f_old],
           nb * sizeof(float));
  *out = net;
  return AX_OK;
}

/* ---- re-packing ---------------------------------------------------------- */

/* Every agent of p, each part's ranks in order, and then those an earlier
 * re-packing left idle. */
static int agents_of(const ax_pipe *p, char (*names)[AXP_NAME]) {
  if (p->npool) {
    memcpy(names, p->pool, (size_t)p->npool * sizeof *names);
    return p->npool;
  }
  int parts = p->nrep ? p->nrep : 1, n = 0;
  for (int i = 0; i < parts; i++) {
    const ax_pipe *q = p->nrep ? p->rep[i] : p;
    for (int r = 0; r < q->R; r++)
      for (int s = 0; s < q->K; s++)
        if (ax_pipe_stage_rank(q->o.mode, q->R, s) == r) {
          snprintf(names[n++], AXP_NAME, "%s", q->agents[s]);
          break;
        }
  }
  return n;
}

static int check_freezable(const ax_pipe *p, const ax_pipe *one) {
  if (p->nrep && axi_pipe_members(p) > 1)
    return ax_seterr(AX_EUNSUPPORTED, "freeze: not of tensor-parallel "
                                      "pipelines yet");
  if (one->o.zero || one->optim_host[0] || one->o.staleness)
    return ax_seterr(AX_EUNSUPPORTED,
                     "freeze: not with sharded or "
                     "offloaded optimizer state or a staleness correction");
  if (one->plan)
    return ax_seterr(AX_ESTATE, "freeze: only between ax_pipe_train calls");
  return AX_OK;
}

typedef struct plan_new {
  int K, R, S, bounds[AX_PIPE_MAX_STAGES + 1];
} plan_new;

static int plan_split(const ax_pipe *one, const ax_freeze_opts *fo, int n,
                      int f_old, int agents, plan_new *pn) {
  int f = fo->blocks, left = n - f, v = one->v;
  int K = fo->K;
  if (K == 0) { /* the old agents times the share of blocks left, rounded
                   up to a divisor of the agents (every agent stays busy)
                   within what the blocks left can hold */
    int most = left / v < one->R ? left / v : one->R;
    K = (one->R * left + (n - f_old) - 1) / (n - f_old);
    while (K < most && agents % K)
      K++;
    K = K > most ? most : K < 1 ? 1 : K;
  }
  if (K < 1 || K > agents || K * v > left)
    return ax_seterr(AX_EINVAL,
                     "freeze: %d agents x %d stages each for %d "
                     "blocks left on %d agents",
                     K, v, left, agents);
  pn->K = K;
  pn->S = K * v;
  pn->R = agents / K;
  if (pn->R > AX_PIPE_MAX_REPLICAS)
    pn->R = AX_PIPE_MAX_REPLICAS;
  AX_TRY(ax_split_uniform(left, pn->S, pn->bounds));
  for (int s = 0; s <= pn->S; s++)
    pn->bounds[s] += f;
  return AX_OK;
}

/* Loads the new stages' files into every part of np. */
static int load_all(ax_pipe *np, stage_files *la, long base) {
  int parts = np->nrep ? np->nrep : 1;
  for (int i = 0; i < parts; i++) {
    ax_pipe *q = np->nrep ? np->rep[i] : np;
    AX_TRY(axi_pipe_all_stages(q, 0, "ckpt_load", load_args_of, NULL, la));
    q->base = base;
  }
  np->base = base;
  return AX_OK;
}

static int repack(ax_pipe *p, ax_pipe *one, const ax_freeze_opts *fo,
                  const ax_model_def *def, const ax_config *cfg, int n,
                  ax_pipe **out) {
  int f_old = axi_pipe_frozen_blocks(p->frozen), f = fo->blocks;
  char names[4 * AX_PIPE_MAX_STAGES][AXP_NAME];
  const char *agents[4 * AX_PIPE_MAX_STAGES];
  int na = agents_of(p, names);
  for (int i = 0; i < na; i++)
    agents[i] = names[i];
  plan_new pn;
  AX_TRY(plan_split(one, fo, n, f_old, na, &pn));
  size_t bp[AX_MODEL_MAX_BLOCKS], bb[AX_MODEL_MAX_BLOCKS];
  size_t pa[AX_MODEL_MAX_BLOCKS + 1] = {0}, ba[AX_MODEL_MAX_BLOCKS + 1] = {0};
  AX_TRY(block_sizes(def, cfg, n, bp, bb));
  /* Offsets in the joined state, which starts at block f_old. */
  for (int i = f_old; i < n; i++) {
    pa[i + 1] = pa[i] + bp[i];
    ba[i + 1] = ba[i] + bb[i];
  }
  gathered g;
  AX_TRY(gather(one, &g));
  int err = AX_OK;
  for (int i = 0; i < J_N && err == AX_OK; i++) {
    size_t want = i == J_BUFFERS ? ba[n] : pa[n];
    if (g.j[i].n && g.j[i].n != want)
      err = ax_seterr(AX_EINTERNAL,
                      "freeze: joined %s has %zu values, the "
                      "blocks %zu",
                      g_rec[i], g.j[i].n, want);
  }
  ax_net *pre = NULL;
  if (err == AX_OK)
    err = prefix_net(def, cfg, one->o.seed, p->frozen, f_old, f, &g, pa, ba,
                     &pre);
  stage_files la;
  memset(&la, 0, sizeof la);
  for (int s = 0; s < pn.S && err == AX_OK; s++)
    err = stage_file(&g, one->o.mode, s, pn.bounds[s], pn.bounds[s + 1], pa, ba,
                     &la);
  ax_pipe *np = NULL;
  if (err == AX_OK) {
    ax_pipe_opts o = one->o;
    o.K = pn.K;
    o.agents = agents;
    o.bounds = pn.bounds;
    o.replicas = pn.R;
    o.tensor_parallel = 0;
    err = ax_pipe_new(one->node, &o, &np);
  }
  if (err == AX_OK)
    err = load_all(np, &la, one->base);
  if (err == AX_OK && !(np->pool = malloc((size_t)na * sizeof *np->pool)))
    err = AX_ENOMEM;
  if (err == AX_OK) {
    memcpy(np->pool, names, (size_t)na * sizeof *names);
    np->npool = na;
    err = axi_pipe_frozen_new(pre, f, fo->cache_bytes, &np->frozen);
  } else {
    ax_net_free(pre);
  }
  pre = NULL;
  stage_files_free(&la);
  gathered_free(&g);
  if (err != AX_OK) {
    char m[512];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    ax_pipe_free(np);
    return ax_seterr(err, "%s", m);
  }
  *out = np;
  return AX_OK;
}

int ax_pipe_freeze(ax_pipe **pp, const ax_freeze_opts *fo) {
  if (!pp || !*pp || !fo)
    return ax_seterr(AX_EINVAL, "freeze: bad arguments");
  ax_pipe *p = *pp, *one = p->nrep ? p->rep[0] : p;
  AX_TRY(check_freezable(p, one));
  const ax_model_def *def = ax_model_find(one->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config cfg;
  ax_model_info info;
  AX_TRY(ax_model_config(def, one->o.model_config, &cfg));
  AX_TRY(def->describe(&cfg, &info));
  int f_old = axi_pipe_frozen_blocks(p->frozen);
  if (fo->blocks <= f_old || fo->blocks >= info.n_blocks)
    return ax_seterr(AX_EINVAL,
                     "freeze: %d blocks (%d frozen already, %d "
                     "in the model: at least one must train)",
                     fo->blocks, f_old, info.n_blocks);
  ax_pipe *np = NULL;
  AX_TRY(repack(p, one, fo, def, &cfg, info.n_blocks, &np));
  ax_pipe_free(p);
  *pp = np;
  return AX_OK;
}

void ax_pipe_freeze_stats(const ax_pipe *p, ax_freeze_stats *out) {
  memset(out, 0, sizeof *out);
  const ax_pipe *one = p->nrep ? p->rep[0] : p;
  out->blocks = axi_pipe_frozen_blocks(p->frozen);
  out->K = one->R;
  out->replicas = p->nrep ? p->nrep / axi_pipe_members(p) : 1;
  if (p->frozen)
    axi_pipe_frozen_counts(p->frozen, &out->hits, &out->misses,
                           &out->cache_bytes);
}

int ax_freeze_schedule_parse(const char *s, ax_freeze_point *pts, int cap,
                             int *n) {
  *n = 0;
  const char *at = s ? s : "";
  while (*at) {
    long step = -1;
    int blocks = 0, K = 0, used = 0;
    int got = sscanf(at, "%ld:%d%n:%d%n", &step, &blocks, &used, &K, &used);
    if (got < 2 || step < 1 || blocks < 1 || K < 0 || *n >= cap ||
        (*n && (step <= pts[*n - 1].step || blocks <= pts[*n - 1].blocks)) ||
        (at[used] && at[used] != ','))
      return ax_seterr(AX_EINVAL,
                       "freeze schedule '%s': entry %d is not "
                       "STEP:BLOCKS[:K] with steps and blocks rising (at "
                       "most %d entries)",
                       s, *n + 1, cap);
    pts[(*n)++] = (ax_freeze_point){step, blocks, K};
    at += used + (at[used] == ',');
  }
  return AX_OK;
}
