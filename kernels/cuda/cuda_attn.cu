/* CUDA backend, fused causal attention: attn_causal_fwd and attn_causal_bwd
 * (contract in kernels/backend-impl.h, reference kernels/cpu/
 * cpu_attn_causal.c), after FlashAttention-2 (Dao 2023), in fp32 on the
 * CUDA cores. No (sq, sk) matrix is ever stored.
 *
 * Threads and registers: a head row (dh <= DH floats, DH = 32, 64, 128 or
 * 256 the smallest that holds dh, zero-padded) is split over TPR = DH / 32
 * adjacent threads; the thread `part` of a row holds dimensions
 * e * TPR + part (e < 32) in registers, so the threads of one row read
 * consecutive shared-memory words. Dot products are summed per thread, then
 * over the row's threads with xor shuffles (every thread of the row gets
 * the same bits, so all take the same branches). Tiles of TILE rows
 * (64 for DH <= 64, 4096 / DH above) live in shared memory, zero-padded.
 *
 * Forward: one block per (b, head, 64 query rows), the last query blocks
 * (the ones that see the most keys) first. The block walks the key tiles
 * up to its last query's position; per tile each row computes its TILE
 * scores into registers, the online-softmax step (running maximum m, sum
 * l of the undropped probabilities, rescaled accumulator) and adds
 * dropout(P) V. Then o = acc * (1 / l) and lse = m + log(l).
 *
 * Backward, three kernels with no atomics (deterministic; the dQ pass
 * recomputes the scores instead of sharing them through atomics):
 *   1. D_i = rowsum(dO_i * O_i), one warp per query row, into scratch;
 *   2. dK, dV: one block per (b, head, 64 keys), each thread owning a key
 *      row's slice of K, V, dK, dV; the block walks the query rows that see
 *      its first key, in shared-memory tiles of Q, dO, lse and D, and per
 *      row computes P = exp(scale q k - lse), dPd = dO v, the dropout
 *      factor f, dS = scale P (f dPd - D), then dV += f P dO, dK += dS q;
 *   3. dQ: one block per (b, head, 64 query rows), each thread owning a
 *      query row's slice of Q, dO, dQ; the block walks the key tiles its
 *      rows see and adds dS k per key.
 * Dropout draws the contract's counter with ax_dropout_uniform (the CPU's
 * function) and scales kept probabilities by 1 / (1 - p) computed on the
 * host as the CPU does: the masks are the CPU's. expf and the summation
 * order differ from the CPU, so values agree to rounding, not bits. */
#include "axon/kernels/cuda/cuda_common.cuh"

#define SL 32 /* head dimensions per thread */

/* ROWS: query rows of a forward or dQ block, keys of a dK/dV block (at
 * most 256 threads, so that no kernel is held under 255 registers). */
template <int DH> struct attn_geo {
  static constexpr int TPR = DH / SL; /* threads per head row */
  static constexpr int ROWS = DH <= 128 ? 64 : 32;
  static constexpr int TILE = DH <= 64 ? 64 : 4096 / DH; /* rows per tile */
  static constexpr int THREADS = ROWS * TPR;
};

/* One (b, head): element offsets of its row 0 in q, k, v and o (and their
 * gradients), of its row 0 in lse and D, and the dropout counter of
 * (position 0, key 0). */
typedef struct attn_head {
  long q, k, v, o, row;
  uint64_t ctr;
} attn_head;

__device__ static attn_head head_of(const ax_attn_desc &d, int bh) {
  const int b = bh / d.heads, h = bh % d.heads;
  attn_head H;
  H.q = b * d.q_sb + (long)h * d.dh;
  H.k = b * d.k_sb + (long)h * d.dh;
  H.v = b * d.v_sb + (long)h * d.dh;
  H.o = b * d.o_sb + (long)h * d.dh;
  H.row = (long)bh * d.sq;
  H.ctr = ((uint64_t)b * (uint64_t)d.heads_total + (uint64_t)(d.head0 + h)) *
          (uint64_t)d.sk * (uint64_t)d.sk;
  return H;
}

/* The dropout factor of key j for the query at position pos: 1 / (1 - p)
 * (ks) when kept, else 0. */
__device__ static inline float keep(const ax_attn_desc &d, const attn_head &H,
                                    float ks, int pos, int j) {
  uint64_t c = H.ctr + (uint64_t)pos * (uint64_t)d.sk + (uint64_t)j;
  return ax_dropout_uniform(d.seed, c) >= d.dropout ? ks : 0.0f;
}

/* The sum of v over the TPR adjacent threads of a row, in every one. */
template <int TPR> __device__ static inline float row_sum(float v) {
#pragma unroll
  for (int o = 1; o < TPR; o <<= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* This thread's share of the dot product of its slice x with a tile row. */
template <int DH>
__device__ static inline float dot_slice(const float *x, const float *row,
                                         int part) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < SL; e++)
    s = fmaf(x[e], row[e * attn_geo<DH>::TPR + part], s);
  return s;
}

/* x (slice) of row i (0 when i >= n) of g at row stride ss. */
template <int DH>
__device__ static inline void load_slice(float *x, const float *g, long ss,
                                         int i, int n, int dh, int part) {
#pragma unroll
  for (int e = 0; e < SL; e++) {
    const int c = e * attn_geo<DH>::TPR + part;
    x[e] = i < n && c < dh ? g[i * ss + c] : 0.0f;
  }
}

/* Row i < n of g (stride ss) from slice x. */
template <int DH>
__device__ static inline void store_slice(const float *x, float *g, long ss,
                                          int i, int n, int dh, int part) {
  if (i >= n)
    return;
#pragma unroll
  for (int e = 0; e < SL; e++) {
    const int c = e * attn_geo<DH>::TPR + part;
    if (c < dh)
      g[i * ss + c] = x[e];
  }
}

/* The TILE x DH shared tile sh from the n rows of g (stride ss), zeros in
 * the other rows and in the columns from dh on. */
template <int DH>
__device__ static void load_tile(float *sh, const float *g, long ss, int n,
                                 int dh) {
  for (int x = threadIdx.x; x < attn_geo<DH>::TILE * DH; x += blockDim.x) {
    const int r = x / DH, c = x % DH;
    sh[x] = r < n && c < dh ? g[r * ss + c] : 0.0f;
  }
}

/* ---- forward ---- */

template <int DH>
__global__ static void __launch_bounds__(attn_geo<DH>::THREADS)
    attn_fwd_kernel(ax_attn_desc d, float ks, int nqb, const float *q,
                    const float *k, const float *v, float *o, float *lse) {
  constexpr int TPR = attn_geo<DH>::TPR, TILE = attn_geo<DH>::TILE;
  constexpr int BR = attn_geo<DH>::ROWS;
  __shared__ float shk[TILE * DH], shv[TILE * DH];
  const int bh = blockIdx.x / nqb;
  const int i0 = (nqb - 1 - (int)(blockIdx.x % nqb)) * BR;
  const attn_head H = head_of(d, bh);
  const int part = threadIdx.x % TPR, i = i0 + threadIdx.x / TPR;
  const int off = d.sk - d.sq, pos = off + i;
  const int last = off + min(d.sq, i0 + BR) - 1; /* the block's last */
  float qr[SL], acc[SL], s[TILE];
  load_slice<DH>(qr, q + H.q, d.q_ss, i, d.sq, d.dh, part);
#pragma unroll
  for (int e = 0; e < SL; e++)
    acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j0 = 0; j0 <= last; j0 += TILE) {
    const int nk = min(TILE, last + 1 - j0);
    __syncthreads(); /* the previous tile's readers are done */
    load_tile<DH>(shk, k + H.k + j0 * d.k_ss, d.k_ss, nk, d.dh);
    load_tile<DH>(shv, v + H.v + j0 * d.v_ss, d.v_ss, nk, d.dh);
    __syncthreads();
    float mx = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < TILE; jj++) {
      const float x =
          d.scale * row_sum<TPR>(dot_slice<DH>(qr, shk + jj * DH, part));
      s[jj] = jj < nk && j0 + jj <= pos ? x : -INFINITY;
      mx = fmaxf(mx, s[jj]);
    }
    /* Key 0, in the first tile, is seen by every row: m is finite after
     * it, and a later tile that the row does not see leaves it (c = 1). */
    const float mn = fmaxf(m, mx);
    const float c = mn == -INFINITY ? 1.0f : expf(m - mn);
    float sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < TILE; jj++) {
      float p = s[jj] == -INFINITY ? 0.0f : expf(s[jj] - mn);
      sum += p;
      if (d.dropout > 0.0f && p != 0.0f)
        p *= keep(d, H, ks, pos, j0 + jj);
      s[jj] = p;
    }
    l = l * c + sum;
    m = mn;
#pragma unroll
    for (int e = 0; e < SL; e++)
      acc[e] *= c;
#pragma unroll
    for (int jj = 0; jj < TILE; jj++)
#pragma unroll
      for (int e = 0; e < SL; e++)
        acc[e] = fmaf(s[jj], shv[jj * DH + e * TPR + part], acc[e]);
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int e = 0; e < SL; e++)
    acc[e] *= inv;
  store_slice<DH>(acc, o + H.o, d.o_ss, i, d.sq, d.dh, part);
  if (lse && part == 0 && i < d.sq)
    lse[H.row + i] = m + logf(l);
}

/* ---- backward ---- */

/* dd[r] = rowsum(dO * O) of query row r of (b, heads, sq), one warp each. */
__global__ static void attn_dd_kernel(ax_attn_desc d, const float *o,
                                      const float *dout, float *dd, long rows) {
  const long r = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) /* the same for the whole warp */
    return;
  const int i = (int)(r % d.sq);
  const attn_head H = head_of(d, (int)(r / d.sq));
  const float *orow = o + H.o + i * d.o_ss, *grow = dout + H.o + i * d.o_ss;
  float s = 0.0f;
  for (int e = lane; e < d.dh; e += 32)
    s = fmaf(grow[e], orow[e], s);
  s = row_sum<32>(s);
  if (lane == 0)
    dd[r] = s;
}

template <int DH>
__global__ static void __launch_bounds__(attn_geo<DH>::THREADS)
    attn_bwd_kv_kernel(ax_attn_desc d, float ks, int nkb, const float *q,
                       const float *k, const float *v, const float *dout,
                       const float *lse, const float *dd, float *dk,
                       float *dv) {
  constexpr int TPR = attn_geo<DH>::TPR, TILE = attn_geo<DH>::TILE;
  constexpr int BR = attn_geo<DH>::ROWS;
  __shared__ float shq[TILE * DH], shg[TILE * DH], shl[TILE], shd[TILE];
  const int bh = blockIdx.x / nkb, j0 = (int)(blockIdx.x % nkb) * BR;
  const attn_head H = head_of(d, bh);
  const int part = threadIdx.x % TPR, j = j0 + threadIdx.x / TPR;
  const int off = d.sk - d.sq;
  float kr[SL], vr[SL], gk[SL], gv[SL];
  load_slice<DH>(kr, k + H.k, d.k_ss, j, d.sk, d.dh, part);
  load_slice<DH>(vr, v + H.v, d.v_ss, j, d.sk, d.dh, part);
#pragma unroll
  for (int e = 0; e < SL; e++)
    gk[e] = gv[e] = 0.0f;
  /* The first query row that sees key j0 is at position j0. */
  for (int i1 = max(0, j0 - off); i1 < d.sq; i1 += TILE) {
    const int nq = min(TILE, d.sq - i1);
    __syncthreads();
    load_tile<DH>(shq, q + H.q + i1 * d.q_ss, d.q_ss, nq, d.dh);
    load_tile<DH>(shg, dout + H.o + i1 * d.o_ss, d.o_ss, nq, d.dh);
    for (int x = threadIdx.x; x < nq; x += blockDim.x) {
      shl[x] = lse[H.row + i1 + x];
      shd[x] = dd[H.row + i1 + x];
    }
    __syncthreads();
    for (int r = 0; r < nq; r++) {
      const int pos = off + i1 + r;
      const float s = row_sum<TPR>(dot_slice<DH>(kr, shq + r * DH, part));
      const float dp = row_sum<TPR>(dot_slice<DH>(vr, shg + r * DH, part));
      const bool vis = j < d.sk && j <= pos;
      const float p = vis ? expf(d.scale * s - shl[r]) : 0.0f;
      const float f = vis && d.dropout > 0.0f ? keep(d, H, ks, pos, j) : 1.0f;
      const float ds = d.scale * p * (f * dp - shd[r]), fp = f * p;
#pragma unroll
      for (int e = 0; e < SL; e++) {
        gv[e] = fmaf(fp, shg[r * DH + e * TPR + part], gv[e]);
        gk[e] = fmaf(ds, shq[r * DH + e * TPR + part], gk[e]);
      }
    }
  }
  store_slice<DH>(gk, dk + H.k, d.k_ss, j, d.sk, d.dh, part);
  store_slice<DH>(gv, dv + H.v, d.v_ss, j, d.sk, d.dh, part);
}

template <int DH>
__global__ static void __launch_bounds__(attn_geo<DH>::THREADS)
    attn_bwd_q_kernel(ax_attn_desc d, float ks, int nqb, const float *q,
                      const float *k, const float *v, const float *dout,
                      const float *lse, const float *dd, float *dq) {
  constexpr int TPR = attn_geo<DH>::TPR, TILE = attn_geo<DH>::TILE;
  constexpr int BR = attn_geo<DH>::ROWS;
  __shared__ float shk[TILE * DH], shv[TILE * DH];
  const int bh = blockIdx.x / nqb;
  const int i0 = (nqb - 1 - (int)(blockIdx.x % nqb)) * BR;
  const attn_head H = head_of(d, bh);
  const int part = threadIdx.x % TPR, i = i0 + threadIdx.x / TPR;
  const int off = d.sk - d.sq, pos = off + i;
  const int last = off + min(d.sq, i0 + BR) - 1;
  const bool row_ok = i < d.sq;
  float qr[SL], gr[SL], gq[SL];
  load_slice<DH>(qr, q + H.q, d.q_ss, i, d.sq, d.dh, part);
  load_slice<DH>(gr, dout + H.o, d.o_ss, i, d.sq, d.dh, part);
#pragma unroll
  for (int e = 0; e < SL; e++)
    gq[e] = 0.0f;
  const float L = row_ok ? lse[H.row + i] : 0.0f;
  const float D = row_ok ? dd[H.row + i] : 0.0f;
  for (int j0 = 0; j0 <= last; j0 += TILE) {
    const int nk = min(TILE, last + 1 - j0);
    __syncthreads();
    load_tile<DH>(shk, k + H.k + j0 * d.k_ss, d.k_ss, nk, d.dh);
    load_tile<DH>(shv, v + H.v + j0 * d.v_ss, d.v_ss, nk, d.dh);
    __syncthreads();
    for (int jj = 0; jj < nk; jj++) {
      const int j = j0 + jj;
      const float s = row_sum<TPR>(dot_slice<DH>(qr, shk + jj * DH, part));
      const float dp = row_sum<TPR>(dot_slice<DH>(gr, shv + jj * DH, part));
      const bool vis = row_ok && j <= pos;
      const float p = vis ? expf(d.scale * s - L) : 0.0f;
      const float f = vis && d.dropout > 0.0f ? keep(d, H, ks, pos, j) : 1.0f;
      const float ds = d.scale * p * (f * dp - D);
#pragma unroll
      for (int e = 0; e < SL; e++)
        gq[e] = fmaf(ds, shk[jj * DH + e * TPR + part], gq[e]);
    }
  }
  store_slice<DH>(gq, dq + H.q, d.q_ss, i, d.sq, d.dh, part);
}

/* ---- launches ---- */

/* Runs fn<DH>(args) for the smallest DH that holds dh (<= 256). */
#define ATTN_DISPATCH(dh, fn, ...)                                             \
  ((dh) <= 32    ? fn<32>(__VA_ARGS__)                                         \
   : (dh) <= 64  ? fn<64>(__VA_ARGS__)                                         \
   : (dh) <= 128 ? fn<128>(__VA_ARGS__)                                        \
                 : fn<256>(__VA_ARGS__))

template <int DH>
static cudaError_t fwd_launch(const ax_attn_desc *d, float ks, cudaStream_t st,
                              const float *q, const float *k, const float *v,
                              float *o, float *lse) {
  constexpr int BR = attn_geo<DH>::ROWS;
  const int nqb = (d->sq + BR - 1) / BR;
  const unsigned blocks = (unsigned)((long)d->b * d->heads * nqb);
  attn_fwd_kernel<DH>
      <<<blocks, attn_geo<DH>::THREADS, 0, st>>>(*d, ks, nqb, q, k, v, o, lse);
  return cudaGetLastError();
}

/* D into dd, then dQ, then dK and dV (with sq == 0, only zeros in dK, dV). */
template <int DH>
static cudaError_t
bwd_launch(const ax_attn_desc *d, float ks, cudaStream_t st, const float *q,
           const float *k, const float *v, const float *o, const float *dout,
           const float *lse, float *dd, float *dq, float *dk, float *dv) {
  constexpr int BR = attn_geo<DH>::ROWS;
  const long heads = (long)d->b * d->heads, rows = heads * d->sq;
  const int nqb = (d->sq + BR - 1) / BR, nkb = (d->sk + BR - 1) / BR;
  const int threads = attn_geo<DH>::THREADS;
  if (rows > 0) {
    attn_dd_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, st>>>(
        *d, o, dout, dd, rows);
    attn_bwd_q_kernel<DH><<<(unsigned)(heads * nqb), threads, 0, st>>>(
        *d, ks, nqb, q, k, v, dout, lse, dd, dq);
  }
  attn_bwd_kv_kernel<DH><<<(unsigned)(heads * nkb), threads, 0, st>>>(
      *d, ks, nkb, q, k, v, dout, lse, dd, dk, dv);
  return cudaGetLastError();
}

/* The geometry check, and the limits of these kernels: dh <= 256, block
 * counts and D's rows within a grid. */
static int attn_check(const ax_attn_desc *d, const char *fn) {
  AX_TRY(ax_attn_desc_check(d, fn));
  if (d->dh > 256)
    return ax_seterr(AX_EUNSUPPORTED,
                     "%s: the CUDA kernels take dh <= 256, not %d", fn, d->dh);
  /* The dK/dV grid is the largest block grid (nkb >= nqb; at most one
   * block per 32 keys), D's grid has one block per 8 rows. */
  const long heads = (long)d->b * d->heads;
  const long kv_blocks = heads * ((d->sk + 31) / 32);
  const long dd_blocks = (heads * d->sq + 7) / 8;
  if (kv_blocks > 0x7fffffffL || dd_blocks > 0x7fffffffL)
    return ax_seterr(AX_EINVAL, "%s: too many blocks (b %d, heads %d, sk %d)",
                     fn, d->b, d->heads, d->sk);
  return AX_OK;
}

static int attn_status(cudaError_t e, const char *fn) {
  if (e == cudaSuccess)
    return AX_OK;
  return ax_seterr(e == cudaErrorMemoryAllocation ? AX_ENOMEM : AX_ECUDA,
                   "%s: %s", fn, cudaGetErrorString(e));
}

static int cuda_attn_causal_fwd(ax_backend *be, const ax_attn_desc *d,
                                const float *q, const float *k, const float *v,
                                float *o, float *lse) {
  AX_TRY(attn_check(d, "attn_causal_fwd"));
  if (d->b == 0 || d->sq == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  const float ks = 1.0f / (1.0f - d->dropout); /* as the CPU computes it */
  return attn_status(ATTN_DISPATCH(d->dh, fwd_launch, d, ks,
                                   axi_cuda_stream(be), q, k, v, o, lse),
                     "attn_causal_fwd");
}

static int cuda_attn_causal_bwd(ax_backend *be, const ax_attn_desc *d,
                                const float *q, const float *k, const float *v,
                                const float *o, const float *do_,
                                const float *lse, float *dq, float *dk,
                                float *dv) {
  AX_TRY(attn_check(d, "attn_causal_bwd"));
  if (d->b == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  const size_t rows = (size_t)d->b * d->heads * d->sq;
  float *dd = (float *)axi_cuda_malloc(ctx, sizeof(float) * (rows ? rows : 1));
  if (!dd)
    return ax_seterr(AX_ENOMEM, "attn_causal_bwd: scratch for %zu rows", rows);
  const float ks = 1.0f / (1.0f - d->dropout);
  cudaError_t e = ATTN_DISPATCH(d->dh, bwd_launch, d, ks, ctx->stream, q, k, v,
                                o, do_, lse, dd, dq, dk, dv);
  axi_cuda_mfree(ctx, dd); /* stream-ordered: safe before completion */
  return attn_status(e, "attn_causal_bwd");
}

void axi_cuda_ops_attn(ax_backend_i *i) {
  i->attn_causal_fwd = cuda_attn_causal_fwd;
  i->attn_causal_bwd = cuda_attn_causal_bwd;
}
