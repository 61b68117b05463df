/* Writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/) with
 * the real encoders: frames from axi_frame_encode, bulk hellos from
 * axi_bulk_hello with proofs from axi_auth_mac (over the harness's token
 * and its all-zero challenge), joins and memberships as ax_node_join and
 * the master send them, every stage message from its encoder
 * (stage_msg-impl.h). Run from the fuzz build:
 *   build-fuzz/tests/fuzz/fuzz_seeds tests/fuzz/corpus
 * It is not run by the tests; its output is checked in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"
#include "axon/rpc/codec-impl.h"
#include "axon/rpc/value-impl.h"
#include "axon/rref/rref.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/stage_msg_samples.h"

static const char *g_dir;

static void put(const char *target, const char *name, const void *p,
                size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, target);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/%s", g_dir, target, name);
  FILE *f = fopen(path, "wb");
  FUZZ_CHECK(f && fwrite(p, 1, len, f) == len && fclose(f) == 0);
}

/* A growable byte buffer. */
typedef struct buf {
  uint8_t *p;
  size_t n;
} buf;

static void add(buf *b, const void *p, size_t len) {
  b->p = realloc(b->p, b->n + len + 1);
  FUZZ_CHECK(b->p);
  memcpy(b->p + b->n, p, len);
  b->n += len;
}

static void add_u8(buf *b, uint8_t v) { add(b, &v, 1); }
static void add_u32(buf *b, uint32_t v) { add(b, &v, 4); }

/* Encodes m (with its tensor bytes) after `lead` bytes of magic. */
static void add_frame(buf *b, const axi_msg *m, int bulk_magic) {
  uint8_t *p;
  size_t len, blob;
  FUZZ_CHECK(axi_frame_encode(m, 4, 1, &p, &len, &blob) == AX_OK);
  if (bulk_magic) {
    uint32_t magic = AXI_BULK_MAGIC;
    memcpy(p, &magic, 4);
    add(b, p, len);
  } else {
    add(b, p + 4, len - 4);
  }
  free(p);
}

static ax_values *sample_values(void) {
  ax_values *v = ax_values_new();
  ax_values_add_i64(v, -42);
  ax_values_add_f64(v, 3.25);
  ax_values_add_str(v, "hello");
  ax_values_add_bytes(v, "\x00\x01\x02", 3);
  int64_t shape[2] = {2, 3};
  ax_tensor *t = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  FUZZ_CHECK(t);
  for (int i = 0; i < 6; i++)
    ((float *)t->data)[i] = (float)i;
  ax_values_add_tensor(v, t);
  ax_tensor_release(t);
  return v;
}

static void bulk_seeds(void) {
  ax_node *n = fuzz_node_new("w1", 2, 1, 1); /* the token of the harness */
  /* The hello's sender: w1 at these addresses, this incarnation. */
  snprintf(n->addr, sizeof n->addr, "127.0.0.1:7100");
  snprintf(n->bulk_addr, sizeof n->bulk_addr, "127.0.0.1:7101");
  n->incarnation = 1000;
  uint8_t nonce[AXI_NONCE_LEN] = {0}, mac[AXI_MAC_LEN];
  axi_auth_mac(n, AXI_AUTH_BULK, nonce, n->name, n->addr, n->bulk_addr,
               n->incarnation, mac);
  ax_values *v = sample_values();
  axi_msg req = {.kind = AXI_REQUEST,
                 .call_id = 7,
                 .fn = "echo",
                 .timeout_ms = 5000,
                 .values = v,
                 .node = "w1",
                 .autograd_ctx = 3,
                 .depth = 1};
  axi_msg meta = req;
  meta.nmeta = 2;
  meta.meta_key[0] = "rr.keep";
  meta.meta_val[0] = 1;
  meta.meta_key[1] = "x";
  meta.meta_val[1] = -5;
  axi_msg rsp = {.kind = AXI_RESPONSE, .call_id = 7, .values = v};
  axi_msg err = {
      .kind = AXI_RESPONSE, .call_id = 8, .err = AX_EINVAL, .errmsg = "bad"};
  for (int auth = 0; auth < 2; auth++) {
    bframe *h = axi_bulk_hello(n, auth ? mac : NULL, auth ? nonce : NULL);
    FUZZ_CHECK(h);
    struct {
      uint8_t mode;
      uint32_t split;
      int frames;
      const char *name;
    } s[] = {{0, 15, 0, "hello"},          {0, 15, 3, "frames"},
             {0, 0, 3, "frames_bytewise"}, {0, 0x1234, 3, "frames_split"},
             {2, 6, 3, "frames_limits"},   {0, 12, 4, "frames_meta"}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
      buf b = {0};
      add_u8(&b, (uint8_t)(s[i].mode | auth));
      add_u32(&b, s[i].split);
      add(&b, h->head, h->head_len);
      if (s[i].frames) {
        add_frame(&b, &req, 1);
        add_frame(&b, &rsp, 1);
        add_frame(&b, &err, 1);
      }
      if (s[i].frames > 3)
        add_frame(&b, &meta, 1);
      char name[64];
      snprintf(name, sizeof name, "%s%s", s[i].name, auth ? "_auth" : "");
      put("bulk_frame", name, b.p, b.n);
      free(b.p);
    }
    axi_bulk_frames_free(h);
  }
  /* A hello under a wrong proof, and a truncated tensor. */
  buf b = {0};
  add_u8(&b, 1);
  add_u32(&b, 9);
  uint8_t wrong[AXI_MAC_LEN] = {0};
  bframe *h = axi_bulk_hello(n, wrong, nonce);
  add(&b, h->head, h->head_len);
  put("bulk_frame", "bad_proof", b.p, b.n);
  free(b.p);
  b = (buf){0};
  add_u8(&b, 0);
  add_u32(&b, 9);
  add(&b, h->head, h->head_len);
  add_frame(&b, &req, 1);
  b.n -= 10;
  put("bulk_frame", "truncated", b.p, b.n);
  free(b.p);
  axi_bulk_frames_free(h);
  ax_values_free(v);
  fuzz_node_free(n);
}

static void codec_seeds(void) {
  ax_values *v = sample_values();
  uint8_t nonce[AXI_MAC_LEN] = {1, 2, 3}; /* a nonce, or a proof's size */
  axi_msg ms[] = {
      {.kind = AXI_REQUEST,
       .call_id = 1,
       .fn = "echo",
       .timeout_ms = 100,
       .values = v,
       .node = "w0",
       .depth = 2,
       .autograd_ctx = 9},
      {.kind = AXI_RESPONSE, .call_id = 1, .values = v},
      {.kind = AXI_RESPONSE,
       .call_id = 2,
       .err = AX_ETIMEOUT,
       .errmsg = "late"},
      {.kind = AXI_PING, .call_id = 3},
      {.kind = AXI_HELLO,
       .node = "w1",
       .addr = "127.0.0.1:7100",
       .bulk_addr = "127.0.0.1:7101",
       .auth = nonce,
       .auth_len = 32},
      {.kind = AXI_CHALLENGE, .auth = nonce, .auth_len = AXI_NONCE_LEN},
  };
  ms[0].nmeta = 1;
  ms[0].meta_key[0] = "rr.keep";
  ms[0].meta_val[0] = 1;
  const char *names[] = {"request", "response", "error",
                         "ping",    "hello",    "challenge"};
  for (int lim = 0; lim < 2; lim++)
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      buf b = {0};
      add_u8(&b, (uint8_t)lim);
      add_frame(&b, &ms[i], 0);
      char name[64];
      snprintf(name, sizeof name, "%s%s", names[i], lim ? "_limits" : "");
      put("codec", name, b.p, b.n);
      free(b.p);
    }
  ax_values_free(v);
}

static void add_len_frame(buf *b, const axi_msg *m) {
  buf f = {0};
  add_frame(&f, m, 0);
  add_u8(b, (uint8_t)(f.n & 0xff));
  add_u8(b, (uint8_t)(f.n >> 8));
  add(b, f.p, f.n);
  free(f.p);
}

static ax_values *join_args(const char *name, int64_t rank, int port,
                            int64_t world) {
  char addr[64], bulk[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  snprintf(bulk, sizeof bulk, "127.0.0.1:%d", port + 1);
  ax_values *a = ax_values_new();
  ax_values_add_str(a, name);
  ax_values_add_i64(a, rank);
  ax_values_add_str(a, addr);
  ax_values_add_str(a, bulk);
  ax_values_add_i64(a, world);
  ax_values_add_i64(a, 1000 + port); /* the incarnation */
  return a;
}

static void join_seeds(void) {
  /* A world of 3: the master (rank 0) and two workers, one with a rank. */
  const struct {
    const char *name;
    int64_t rank;
  } j[] = {{"master", -1}, {"w1", -1}, {"w2", 2},
           {"w1", -1},     {"w3", 7},  {"w4", 2147483647}};
  buf b = {0};
  add_u8(&b, 2); /* world 3 */
  add_u8(&b, 1); /* the master's rank 0 */
  for (size_t i = 0; i < sizeof j / sizeof j[0]; i++) {
    ax_values *a = join_args(j[i].name, j[i].rank, 7000 + 10 * (int)i, 3);
    axi_msg m = {.kind = AXI_REQUEST,
                 .call_id = i + 1,
                 .fn = "axon.rendezvous.join",
                 .values = a,
                 .node = j[i].name};
    add_len_frame(&b, &m);
    ax_values_free(a);
  }
  axi_msg st = {
      .kind = AXI_REQUEST, .call_id = 99, .fn = "axon.rendezvous.stats"};
  add_len_frame(&b, &st);
  put("join", "world3", b.p, b.n);
  free(b.p);
  /* A membership as a joiner receives it. */
  ax_values *mv = ax_values_new();
  ax_values_add_i64(mv, 3);
  ax_values_add_str(mv, "boss");
  const char *names[] = {"boss", "master", "w2"};
  for (int r = 0; r < 3; r++) {
    char addr[64];
    ax_values_add_str(mv, names[r]);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", 7200 + r);
    ax_values_add_str(mv, addr);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", 7300 + r);
    ax_values_add_str(mv, addr);
    ax_values_add_i64(mv, 1000 + r); /* the incarnation */
  }
  b = (buf){0};
  add_u8(&b, 0);
  add_u8(&b, 0);
  axi_msg rsp = {.kind = AXI_RESPONSE, .call_id = 1, .values = mv};
  add_len_frame(&b, &rsp);
  add_len_frame(&b, &rsp);
  put("join", "membership", b.p, b.n);
  free(b.p);
  ax_values_free(mv);
  /* A membership whose world size overflows 2 + 4 * world (regression:
   * signed overflow in axi_rendezvous_apply before the range check). */
  mv = ax_values_new();
  ax_values_add_i64(mv, 0x3000000000000001ll);
  ax_values_add_str(mv, "boss");
  ax_values_add_str(mv, "w1");
  b = (buf){0};
  add_u8(&b, 0);
  add_u8(&b, 0);
  rsp.values = mv;
  add_len_frame(&b, &rsp);
  put("join", "regress_world_overflow", b.p, b.n);
  free(b.p);
  ax_values_free(mv);
}

/* The RRef payload (rref/rref_codec.c, wire_rref: ids, type, owner and
 * parent names). */
typedef struct wire {
  uint64_t id, fork, parent_fork;
  uint32_t type, pad;
  char owner[64], parent[64];
} wire;

static void rref_seeds(void) {
  const struct {
    uint64_t id, fork, pfork;
    uint32_t type;
    const char *owner, *parent, *name;
    uint8_t tag;
  } s[] = {
      {0x0001000000000005ull, 0x0002000000000001ull, 0, 0, "w1", "w1",
       "from_owner", 0},
      {0x0001000000000006ull, 0x0003000000000002ull, 0x0002000000000001ull, 1,
       "w1", "w2", "from_user", 2},
      {0x0000000000000007ull, 0x0002000000000003ull, 0, 1, "fuzz", "w2",
       "to_owner", 2},
      {0x0000000000000008ull, 0x0000000000000009ull, 0, 0, "fuzz", "fuzz",
       "own_fork", 0},
  };
  buf all = {0};
  for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
    wire w;
    memset(&w, 0, sizeof w);
    w.id = s[i].id;
    w.fork = s[i].fork;
    w.parent_fork = s[i].pfork;
    w.type = s[i].type;
    snprintf(w.owner, sizeof w.owner, "%s", s[i].owner);
    snprintf(w.parent, sizeof w.parent, "%s", s[i].parent);
    buf b = {0};
    add_u8(&b, s[i].tag);
    add(&b, &w, sizeof w);
    put("rref", s[i].name, b.p, b.n);
    add(&all, b.p, b.n);
    free(b.p);
  }
  put("rref", "sequence", all.p, all.n);
  free(all.p);
}

/* The RRef of the stage message seeds is an object of "fuzz" (the
 * harness's node), as its payload travels (rref_seeds); without an RRef
 * context here, an extension kind of this program writes that payload. */
static int seed_rref_encode(void *obj, void **out, size_t *len) {
  FUZZ_CHECK((*out = malloc(sizeof(wire))));
  memcpy(*out, obj, sizeof(wire));
  *len = sizeof(wire);
  return AX_OK;
}
static int seed_rref_decode(const void *d, size_t n, const char *f, void **o) {
  return AX_EUNSUPPORTED;
}
static const ax_value_ext_ops g_seed_rref = {"rref payload", seed_rref_encode,
                                             seed_rref_decode, NULL, NULL};

/* A frame of a call carrying v, after byte 0 (from which value on the
 * harness's decoders see the list). */
static void put_call(const char *name, uint8_t from, ax_values *v) {
  axi_msg m = {.kind = AXI_REQUEST,
               .call_id = 1,
               .fn = "axon.rref.call",
               .values = v,
               .node = "peer"};
  buf b = {0};
  add_u8(&b, from);
  add_frame(&b, &m, 0);
  put("stage_msg", name, b.p, b.n);
  free(b.p);
}

static void stage_msg_seeds(void) {
  FUZZ_CHECK(ax_value_ext_register(AX_VALUE_EXT_RREF, &g_seed_rref) == AX_OK);
  wire w = {
      0x0000000000000007ull, 0x0000000000000008ull, 0, 1, 0, "fuzz", "fuzz"};
  ax_tensor *t[3];
  for (int i = 0; i < 3; i++) {
    int64_t n = i + 2;
    FUZZ_CHECK((t[i] = ax_tensor_new(i == 2 ? AX_I32 : AX_F32, 1, &n, AX_CPU)));
    memset(t[i]->data, 0, ax_tensor_nbytes(t[i]));
  }
  for (int id = 0; id < axi_pipe_msg_count(); id++) {
    size_t n_full = 0;
    for (int full = 1; full >= 0; full--) { /* "min": no optional part */
      sm_any m;
      sm_sample(id, &m, full, t, (ax_rref *)&w);
      ax_values *v = ax_values_new();
      FUZZ_CHECK(v && axi_pipe_msg_encode(id, &m, v) == AX_OK);
      if (full)
        n_full = ax_values_count(v);
      else if (ax_values_count(v) == n_full) { /* none: the same message */
        ax_values_free(v);
        continue;
      }
      char name[96];
      snprintf(name, sizeof name, "%s%s", axi_pipe_msg_name(id),
               full ? "" : " min");
      for (char *c = name; *c; c++)
        *c = (*c == ' ' || *c == '.') ? '_' : *c;
      put_call(name, 0, v);
      if (full && sm_is(id, "axon.pipe.stage setup")) {
        /* Named optional parts: the last two without those before them. */
        axi_pipe_setup_msg *sp = (axi_pipe_setup_msg *)&m;
        sp->has_stale = sp->has_replicas = sp->has_zero = sp->has_tp = 0;
        ax_values *u = ax_values_new();
        FUZZ_CHECK(u && axi_pipe_setup_encode(sp, u) == AX_OK);
        put_call("axon_pipe_stage_setup_sparse", 0, u);
        ax_values_free(u);
      }
      if (full && sm_is(id, "axon.pipe.stage step")) {
        /* The tail of a longer list: [h, "x", step...] from value 2. */
        ax_values *u = ax_values_new();
        ax_values_add_i64(u, 9);
        ax_values_add_str(u, "x");
        FUZZ_CHECK(ax_values_append(u, v) == AX_OK);
        put_call("tail_view", 2, u);
        ax_values_free(u);
      }
      ax_values_free(v);
    }
  }
  for (int i = 0; i < 3; i++)
    ax_tensor_release(t[i]);
}

static void text(const char *target, const char *name, const char *s) {
  put(target, name, s, strlen(s));
}

static void http_seeds(void) {
  text("http", "healthz", "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
  text("http", "metrics", "GET /metrics HTTP/1.0\r\n\r\n");
  text("http", "not_found", "GET /x?y=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  text("http", "post",
       "POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello");
  text("http", "pipelined",
       "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics HTTP/1.1\r\n"
       "Host: a\r\nConnection: close\r\n\r\n");
  text("http", "chunked",
       "POST /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
       "\r\n5\r\nhello\r\n0\r\n\r\n");
  text("http", "head", "HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
}

static void config_seeds(void) {
  /* byte 0: the model (mlp, resnet20, bert, sleep) and the flag ranges. */
  text("config", "mlp",
       "\x00widths=784/256/10,dropout=0.1\nopt=sgd,lr=0.1,momentum=0.9\n"
       "shape=1/28/28,classes=10\n127.0.0.1:7000");
  text("config", "resnet20",
       "\x01in_channels=3,classes=10,image=32\nopt=adam,lr=0.001,wd=0.0005\n"
       "shape=3/32/32,classes=10,examples=64\n4G");
  text("config", "bert",
       "\x02layers=2,hidden=64,heads=2,seq=32,vocab=1000\n"
       "opt=adamw,lr=0.0001,warmup=10,sched=cosine,total=100\n"
       "shape=32,classes=2\ncuda:0");
  text("config", "sleep",
       "\x03"
       "blocks=4,fwd_ms=1,bwd_ms=2\nlr=0.1,nesterov=1\nseed=3\n"
       "cpu=cuda:0,cuda:1=cpu");
  text("config", "unknown_key",
       "\x04widths=10/10,bogus=1\nlr=x\nshape=1/2/3/4\n-1");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  mkdir(g_dir, 0755);
  bulk_seeds();
  codec_seeds();
  join_seeds();
  rref_seeds();
  http_seeds();
  config_seeds();
  stage_msg_seeds();
  return 0;
}
