// CUDA chunked KDA prefill (cuda.h kda_chunked), MODEL.md §4.6, the CPU chunk_step in
// two phases. Chunks start at multiples of chunk_size from the start of the call (the
// last may be short); every per-chunk tile is padded with zeros to kChunkRows = 64 rows
// and kp = head_dim rounded up to 16 columns, so the tensor-core tiles need no masks.
// The tokens run in slabs of up to kSlabChunks chunks; the workspace holds one slab.
//
// 1. intra_chunk_kernel, grid (chunks of the slab, H), 256 threads: everything that does
//    not depend on S, all chunks of all heads at once.
//      G = inclusive cumsum of g (double, as the CPU);
//      L[c,j] = beta_c sum_d k_c k_j exp(G_c - G_j) (c > j), Aqk[c,j] = sum_d q_c k_j
//      exp(G_c - G_j) (c >= j): one (c, j) pair per lane, fp32 on CUDA cores, each
//      exponent rounded to fp32 after the double subtraction, so only exp(<= 0) is formed;
//      (I+L)^-1 by 16x16 blocks: the 4 diagonal blocks by forward substitution (one warp
//      each), then the off-diagonal blocks by distance from the diagonal,
//      inv_RC = -inv_RR sum_{C <= i < R} L_Ri inv_iC;
//      A = (I+L)^-1 diag(beta); W = A (exp(G) K), U = A V on tensor cores.
//    Writes one record per (chunk, head) to the workspace (ChunkRecord):
//      qg = Q exp(G), kg = K exp(G_last - G), W, U: [64, kp] each; Aqk [64, 64];
//      decay = exp(G_last) [kp].
//    Shared memory (transposed tiles have row stride 65, odd, so lanes walking the
//    channels or the tokens hit distinct banks):
//      G^T [kp, 65] double (later V [64, kp]) | K^T [kp, 65] | Q^T [kp, 65] (later
//      exp(G) K [64, kp]) | L, then A [64, 64] | inv [64, 64] | X [3, 16, 16] | beta [64]
//      kp = 128: 165 KiB (one block per SM).
// 2. inter_chunk_kernel, grid (H, V-slices of kVSlice = 64, 32 or 16 columns: pick_slice),
//    256 threads; each block carries S[:, slice] in shared memory through the slab's chunks
//    in order:
//      V' = U - W S;  O = qg S + Aqk V';  S = decay * S + kg^T V'.
//    Shared memory: S [kp, kVSlice] | W, then qg, then kg [64, kp] | U, then V' [64, kVSlice]
//      | Aqk, then O [64, 64] | decay [kp]; kp = 128: 96.5 KiB at 64 columns (two blocks per
//      SM). Each output element sums the same products in the same order at every slice
//      width: the width changes no bit.
//
// Precision: every matrix product runs on tensor cores as 3xTF32 (a = a_hi + a_lo, both
// tf32; a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi, accumulated in fp32): the dropped
// a_lo b_lo and the rounding of the lo parts are ~2^-22 of |a b|, close to an fp32
// product, where plain tf32 (2^-11) would be ~100x off the CPU. The exponentials and
// L, Aqk, (I+L)^-1 are fp32 on CUDA cores.
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "kernels/kda/cuda.h"
#include "kernels/kda/cuda/check_params.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kChunkRows = 64;  // rows of every per-chunk tile; the largest chunk_size
constexpr int64_t kSlabChunks = 64;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// V columns per inter-chunk block: 64, or 32 / 16 where H x slices would leave SMs idle
// (pick_slice; the blocks walk the slab's chunks in order, so the grid is all the parallelism).
constexpr int kMaxVSlice = 64;
constexpr int kTStride = 65;  // row stride of the transposed [kp, chunk] tiles
constexpr int kBlock = 16;    // side of the blocks of the (I+L)^-1 solve
constexpr int kNumBlocks = kChunkRows / kBlock;

int padded_dim(int64_t head_dim) {
  return static_cast<int>((head_dim + 15) / 16 * 16);
}

// Floats of one (chunk, head) record; a multiple of 16, so every record and every
// [.., kp] tile in it is 64-byte aligned (wmma needs 32).
__host__ __device__ int64_t record_floats(int kp) {
  return 4 * kChunkRows * kp + kChunkRows * kChunkRows + kp;
}

struct ChunkRecord {
  float* qg;     // [64, kp] q * exp(G)
  float* kg;     // [64, kp] k * exp(G_last - G)
  float* w;      // [64, kp] W = A (exp(G) K)
  float* u;      // [64, kp] U = A V
  float* aqk;    // [64, 64] Aqk, zero above the diagonal
  float* decay;  // [kp] exp(G_last)
};

// The record of chunk `chunk` of the slab and head h: records are [chunk, H].
__device__ ChunkRecord chunk_record(float* ws, int64_t chunk, int64_t h, int64_t num_heads,
                                    int kp) {
  float* base = ws + (chunk * num_heads + h) * record_floats(kp);
  const int64_t tile = static_cast<int64_t>(kChunkRows) * kp;
  return {base,
          base + tile,
          base + 2 * tile,
          base + 3 * tile,
          base + 4 * tile,
          base + 4 * tile + kChunkRows * kChunkRows};
}

struct HeadRows {
  int64_t num_heads, dim, h;
  __device__ int64_t row(int64_t t) const { return (t * num_heads + h) * dim; }
};

using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
template <typename Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, Layout>;
template <typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, Layout>;

// hi (holding x on entry) becomes tf32(sign x), lo tf32(sign x - hi).
template <typename Frag>
__device__ void split_tf32(Frag& hi, Frag& lo, float sign) {
  for (int i = 0; i < hi.num_elements; ++i) {
    const float x = sign * hi.x[i];
    hi.x[i] = wmma::__float_to_tf32(x);
    lo.x[i] = wmma::__float_to_tf32(x - hi.x[i]);
  }
}

// acc += sign * A B for one k-step: A [16, 8] at a (leading dimension lda, LayoutA),
// B [8, 16] at b (ldb, LayoutB), 3xTF32 (small terms first).
template <typename LayoutA, typename LayoutB>
__device__ void mma_3xtf32(FragAcc& acc, const float* a, unsigned lda, const float* b, unsigned ldb,
                           float sign = 1.0f) {
  FragA<LayoutA> a_hi, a_lo;
  FragB<LayoutB> b_hi, b_lo;
  wmma::load_matrix_sync(a_hi, a, lda);
  wmma::load_matrix_sync(b_hi, b, ldb);
  split_tf32(a_hi, a_lo, sign);
  split_tf32(b_hi, b_lo, 1.0f);
  wmma::mma_sync(acc, a_lo, b_hi, acc);
  wmma::mma_sync(acc, a_hi, b_lo, acc);
  wmma::mma_sync(acc, a_hi, b_hi, acc);
}

// dst[0, n) = src[0, n), n a multiple of 4, both 16-byte aligned; the whole block.
__device__ void copy_floats(float* dst, const float* src, int n) {
  float4* d4 = reinterpret_cast<float4*>(dst);
  const float4* s4 = reinterpret_cast<const float4*>(src);
  for (int i = threadIdx.x; i < n / 4; i += kThreads) d4[i] = s4[i];
}

size_t intra_shared_bytes(int kp) {
  return sizeof(double) * kp * kTStride + sizeof(float) * 2 * kp * kTStride +
         sizeof(float) *
             (2 * kChunkRows * kChunkRows + (kNumBlocks - 1) * kBlock * kBlock + kChunkRows);
}

__global__ void __launch_bounds__(kThreads)
    intra_chunk_kernel(const KdaParams p, float* ws, int64_t slab_t0, int64_t chunk, int kp) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t h = blockIdx.y;
  const int64_t t0 = slab_t0 + blockIdx.x * chunk;
  const int n = static_cast<int>(p.num_tokens - t0 < chunk ? p.num_tokens - t0 : chunk);
  const int dk = static_cast<int>(p.head_dim);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const HeadRows rows{p.num_heads, p.head_dim, h};
  const ChunkRecord rec = chunk_record(ws, blockIdx.x, h, p.num_heads, kp);

  double* g_t = reinterpret_cast<double*>(smem);               // [kp, 65] G^T
  float* v_s = reinterpret_cast<float*>(smem);                 // [64, kp] V, once G is dead
  float* k_t = reinterpret_cast<float*>(g_t + kp * kTStride);  // [kp, 65] K^T
  float* q_t = k_t + kp * kTStride;                            // [kp, 65] Q^T
  float* kexp = q_t;                                         // [64, kp] exp(G) K, once Q^T is dead
  float* l_s = q_t + kp * kTStride;                          // [64, 64] L, then A
  float* inv = l_s + kChunkRows * kChunkRows;                // [64, 64] (I+L)^-1
  float* x_s = inv + kChunkRows * kChunkRows;                // [3, 16, 16] block sums
  float* beta_s = x_s + (kNumBlocks - 1) * kBlock * kBlock;  // [64]

  // Stage k, q, g transposed, zero past the chunk's n tokens and past head_dim.
  for (int i = tid; i < kChunkRows * kp; i += kThreads) {
    const int c = i / kp, d = i % kp;
    const bool in = c < n && d < dk;
    const int64_t at = in ? rows.row(t0 + c) + d : 0;
    k_t[d * kTStride + c] = in ? p.k[at] : 0.0f;
    q_t[d * kTStride + c] = in ? p.q[at] : 0.0f;
    g_t[d * kTStride + c] = in ? static_cast<double>(p.g[at]) : 0.0;
  }
  if (tid < kChunkRows) beta_s[tid] = tid < n ? p.beta[(t0 + tid) * p.num_heads + h] : 0.0f;
  for (int i = tid; i < kChunkRows * kChunkRows; i += kThreads) inv[i] = 0.0f;
  __syncthreads();
  // G, in double (cpu.cpp says why); past n tokens it stays G_last.
  if (tid < kp) {
    double* gd = g_t + tid * kTStride;
    for (int c = 1; c < kChunkRows; ++c) gd[c] += gd[c - 1];
  }
  __syncthreads();

  // L and Aqk. Warp w takes rows 16b + w and 16b + 15 - w of each 16-row band b (equal
  // work per warp); lane owns columns lane and lane + 32, the second only for rows >= 32.
  for (int band = 0; band < kNumBlocks; ++band) {
    const int r0 = kBlock * band + warp, r1 = kBlock * band + kBlock - 1 - warp;
    const int halves = band < 2 ? 1 : 2;
    float kk[2][2] = {}, qk[2][2] = {};
    for (int d = 0; d < dk; ++d) {
      const double* gd = g_t + d * kTStride;
      const float* kd = k_t + d * kTStride;
      const float* qd = q_t + d * kTStride;
      const double g0 = gd[r0], g1 = gd[r1];
      const float k0 = kd[r0], k1 = kd[r1], q0 = qd[r0], q1 = qd[r1];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        if (hf < halves) {
          const int j = lane + 32 * hf;
          const double gj = gd[j];
          const float kj = kd[j];
          // j > row gives exp(> 0), possibly inf: those pairs are dropped below.
          const float e0 = expf(static_cast<float>(g0 - gj));
          const float e1 = expf(static_cast<float>(g1 - gj));
          kk[0][hf] += k0 * kj * e0;
          qk[0][hf] += q0 * kj * e0;
          kk[1][hf] += k1 * kj * e1;
          qk[1][hf] += q1 * kj * e1;
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int c = rr == 0 ? r0 : r1;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int j = lane + 32 * hf;
        const bool live = hf < halves && c < n;
        l_s[c * kChunkRows + j] = live && j < c ? beta_s[c] * kk[rr][hf] : 0.0f;
        rec.aqk[c * kChunkRows + j] = live && j <= c ? qk[rr][hf] : 0.0f;
      }
    }
  }
  __syncthreads();

  // The inter-chunk factors (past n tokens G = G_last and q = k = 0: zeros, no inf).
  for (int i = tid; i < kChunkRows * kp; i += kThreads) {
    const int c = i / kp, d = i % kp;
    const double gc = g_t[d * kTStride + c];
    const double gl = g_t[d * kTStride + n - 1];
    rec.qg[i] = q_t[d * kTStride + c] * expf(static_cast<float>(gc));
    rec.kg[i] = k_t[d * kTStride + c] * expf(static_cast<float>(gl - gc));
  }
  if (tid < kp) {
    rec.decay[tid] = tid < dk ? expf(static_cast<float>(g_t[tid * kTStride + n - 1])) : 0.0f;
  }
  __syncthreads();
  for (int i = tid; i < kChunkRows * kp; i += kThreads) {
    const int c = i / kp, d = i % kp;
    kexp[i] = k_t[d * kTStride + c] * expf(static_cast<float>(g_t[d * kTStride + c]));
  }

  // (I+L)^-1, diagonal blocks: lane j < 16 of warp b < 4 solves column j of block b,
  // inv[r,j] = [r == j] - sum_{j <= i < r} L[r,i] inv[i,j], reading only its own column.
  if (warp < kNumBlocks && lane < kBlock) {
    const int b = kBlock * warp, j = lane;
    for (int r = j; r < kBlock; ++r) {
      float acc = 0.0f;
      for (int i = j; i < r; ++i) {
        acc += l_s[(b + r) * kChunkRows + b + i] * inv[(b + i) * kChunkRows + b + j];
      }
      inv[(b + r) * kChunkRows + b + j] = r == j ? 1.0f : -acc;
    }
  }
  __syncthreads();
  // Off-diagonal blocks (R, C = R - dist): X = sum_{16C <= i < 16R} L[16R + r, i]
  // inv[i, 16C + c] uses blocks nearer the diagonal; then inv_RC = -inv_RR X.
  for (int dist = 1; dist < kNumBlocks; ++dist) {
    const int num_pairs = kNumBlocks - dist;
    for (int e = tid; e < num_pairs * kBlock * kBlock; e += kThreads) {
      const int col_block = e / (kBlock * kBlock), r = e / kBlock % kBlock, c = e % kBlock;
      const int R = kBlock * (col_block + dist), C = kBlock * col_block;
      float acc = 0.0f;
      for (int i = C; i < R; ++i)
        acc += l_s[(R + r) * kChunkRows + i] * inv[i * kChunkRows + C + c];
      x_s[e] = acc;
    }
    __syncthreads();
    for (int e = tid; e < num_pairs * kBlock * kBlock; e += kThreads) {
      const int col_block = e / (kBlock * kBlock), r = e / kBlock % kBlock, c = e % kBlock;
      const int R = kBlock * (col_block + dist), C = kBlock * col_block;
      const float* x = x_s + col_block * kBlock * kBlock;
      float acc = 0.0f;
      for (int i = 0; i <= r; ++i) acc += inv[(R + r) * kChunkRows + R + i] * x[i * kBlock + c];
      inv[(R + r) * kChunkRows + C + c] = -acc;
    }
    __syncthreads();
  }

  // A = (I+L)^-1 diag(beta) (zero rows and columns past n: beta is 0 there); V into
  // the dead G^T.
  for (int i = tid; i < kChunkRows * kChunkRows; i += kThreads) {
    l_s[i] = inv[i] * beta_s[i % kChunkRows];
  }
  for (int i = tid; i < kChunkRows * kp; i += kThreads) {
    const int c = i / kp, d = i % kp;
    v_s[i] = c < n && d < dk ? p.v[rows.row(t0 + c) + d] : 0.0f;
  }
  __syncthreads();

  // W = A (exp(G) K) and U = A V, 16x16 output tiles over the warps; A is lower
  // triangular, so row tile rt needs k < 16 (rt + 1).
  const int col_tiles = kp / 16;
  const int row_tiles = kChunkRows / 16;
  for (int t = warp; t < 2 * row_tiles * col_tiles; t += kWarps) {
    const bool is_u = t >= row_tiles * col_tiles;
    const int tt = is_u ? t - row_tiles * col_tiles : t;
    const int rt = tt / col_tiles, ct = tt % col_tiles;
    const float* b = is_u ? v_s : kexp;
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < 16 * (rt + 1); k0 += 8) {
      mma_3xtf32<wmma::row_major, wmma::row_major>(acc, l_s + 16 * rt * kChunkRows + k0, kChunkRows,
                                                   b + k0 * kp + 16 * ct, kp);
    }
    wmma::store_matrix_sync((is_u ? rec.u : rec.w) + 16 * rt * kp + 16 * ct, acc, kp,
                            wmma::mem_row_major);
  }
}

size_t inter_shared_bytes(int kp, int slice) {
  return sizeof(float) *
         (kp * slice + kChunkRows * kp + kChunkRows * slice + kChunkRows * kChunkRows + kp);
}

template <int kVSlice>
__global__ void __launch_bounds__(kThreads, 2)
    inter_chunk_kernel(const KdaParams p, float* ws, int64_t slab_t0, int num_chunks, int64_t chunk,
                       int kp) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t h = blockIdx.x;
  const int e0 = blockIdx.y * kVSlice;
  const int sv = kp - e0 < kVSlice ? kp - e0 : kVSlice;  // slice columns, a multiple of 16
  const int dk = static_cast<int>(p.head_dim);
  const int dv = dk;
  const int tid = threadIdx.x, warp = tid / 32;
  const HeadRows rows{p.num_heads, p.head_dim, h};
  float* s = reinterpret_cast<float*>(smem);     // [kp, 64] S[:, e0 : e0 + sv]
  float* buf = s + kp * kVSlice;                 // [64, kp] W, then qg, then kg
  float* vv = buf + kChunkRows * kp;             // [64, 64] U, then V'
  float* aqk = vv + kChunkRows * kVSlice;        // [64, 64] Aqk, then O
  float* decay = aqk + kChunkRows * kChunkRows;  // [kp]
  float* state = p.state + h * p.head_dim * p.head_dim;
  const int col_tiles = sv / 16;
  const int row_tiles = kChunkRows / 16;
  const int num_out_tiles = row_tiles * col_tiles;  // <= 16: at most 2 per warp

  for (int i = tid; i < kp * kVSlice; i += kThreads) {
    const int d = i / kVSlice, e = i % kVSlice;
    s[i] = d < dk && e < sv && e0 + e < dv ? state[d * dv + e0 + e] : 0.0f;
  }

  for (int ci = 0; ci < num_chunks; ++ci) {
    const ChunkRecord rec = chunk_record(ws, ci, h, p.num_heads, kp);
    const int64_t t0 = slab_t0 + ci * chunk;
    const int n = static_cast<int>(p.num_tokens - t0 < chunk ? p.num_tokens - t0 : chunk);

    copy_floats(buf, rec.w, kChunkRows * kp);
    for (int i = tid; i < kChunkRows * sv / 4; i += kThreads) {
      const int c = i / (sv / 4), e4 = i % (sv / 4);
      reinterpret_cast<float4*>(vv + c * kVSlice)[e4] =
          reinterpret_cast<const float4*>(rec.u + c * kp + e0)[e4];
    }
    copy_floats(aqk, rec.aqk, kChunkRows * kChunkRows);
    if (tid < kp) decay[tid] = rec.decay[tid];
    __syncthreads();

    // V' = U - W S.
    for (int t = warp; t < num_out_tiles; t += kWarps) {
      const int rt = t / col_tiles, ct = t % col_tiles;
      float* tile = vv + 16 * rt * kVSlice + 16 * ct;
      FragAcc acc;
      wmma::load_matrix_sync(acc, tile, kVSlice, wmma::mem_row_major);
      for (int k0 = 0; k0 < kp; k0 += 8) {
        mma_3xtf32<wmma::row_major, wmma::row_major>(acc, buf + 16 * rt * kp + k0, kp,
                                                     s + k0 * kVSlice + 16 * ct, kVSlice, -1.0f);
      }
      wmma::store_matrix_sync(tile, acc, kVSlice, wmma::mem_row_major);
    }
    __syncthreads();
    copy_floats(buf, rec.qg, kChunkRows * kp);
    __syncthreads();

    // O = qg S + Aqk V' (Aqk lower triangular: row tile rt needs k < 16 (rt + 1)).
    FragAcc o_acc[2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int t = warp + m * kWarps;
      if (t < num_out_tiles) {
        const int rt = t / col_tiles, ct = t % col_tiles;
        wmma::fill_fragment(o_acc[m], 0.0f);
        for (int k0 = 0; k0 < kp; k0 += 8) {
          mma_3xtf32<wmma::row_major, wmma::row_major>(o_acc[m], buf + 16 * rt * kp + k0, kp,
                                                       s + k0 * kVSlice + 16 * ct, kVSlice);
        }
        for (int k0 = 0; k0 < 16 * (rt + 1); k0 += 8) {
          mma_3xtf32<wmma::row_major, wmma::row_major>(o_acc[m], aqk + 16 * rt * kChunkRows + k0,
                                                       kChunkRows, vv + k0 * kVSlice + 16 * ct,
                                                       kVSlice);
        }
      }
    }
    __syncthreads();

    // O into the Aqk tile, kg into buf, S = diag(exp(G_last)) S.
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int t = warp + m * kWarps;
      if (t < num_out_tiles) {
        const int rt = t / col_tiles, ct = t % col_tiles;
        wmma::store_matrix_sync(aqk + 16 * rt * kChunkRows + 16 * ct, o_acc[m], kChunkRows,
                                wmma::mem_row_major);
      }
    }
    copy_floats(buf, rec.kg, kChunkRows * kp);
    for (int i = tid; i < kp * kVSlice; i += kThreads) s[i] *= decay[i / kVSlice];
    __syncthreads();

    // Write O; S += kg^T V' (kg^T is buf read column-major).
    for (int i = tid; i < n * sv; i += kThreads) {
      const int c = i / sv, e = i % sv;
      if (e0 + e < dv) p.o[rows.row(t0 + c) + e0 + e] = aqk[c * kChunkRows + e];
    }
    for (int t = warp; t < (kp / 16) * col_tiles; t += kWarps) {
      const int rt = t / col_tiles, ct = t % col_tiles;
      float* tile = s + 16 * rt * kVSlice + 16 * ct;
      FragAcc acc;
      wmma::load_matrix_sync(acc, tile, kVSlice, wmma::mem_row_major);
      for (int k0 = 0; k0 < kChunkRows; k0 += 8) {
        mma_3xtf32<wmma::col_major, wmma::row_major>(acc, buf + k0 * kp + 16 * rt, kp,
                                                     vv + k0 * kVSlice + 16 * ct, kVSlice);
      }
      wmma::store_matrix_sync(tile, acc, kVSlice, wmma::mem_row_major);
    }
    __syncthreads();
  }

  for (int i = tid; i < kp * kVSlice; i += kThreads) {
    const int d = i / kVSlice, e = i % kVSlice;
    if (d < dk && e < sv && e0 + e < dv) state[d * dv + e0 + e] = s[i];
  }
}

// The widest V slice (64, 32, 16 columns) whose H x slices blocks fill every SM once; 16 when
// none does. K3 at TP8 has 12 KDA heads: 24 blocks of 64 columns on an H100's 132 SMs, 96 of 16.
int pick_slice(int64_t num_heads, int kp) {
  int device = 0, num_sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  for (const int slice : {kMaxVSlice, 32}) {
    if (num_heads * ((kp + slice - 1) / slice) >= num_sms) return slice;
  }
  return 16;
}

int64_t num_chunks_of(const KdaParams& p, int64_t chunk_size) {
  return (p.num_tokens + chunk_size - 1) / chunk_size;
}

void check_chunk_size(int64_t chunk_size) {
  CHECK(chunk_size > 0 && chunk_size <= kChunkRows, "kda_chunked: chunk_size = ", chunk_size,
        " (the CUDA kernel takes 1..", kChunkRows, ")");
}

}  // namespace

size_t kda_chunked_workspace_bytes(const KdaParams& p, int64_t chunk_size) {
  check_chunk_size(chunk_size);
  if (p.num_tokens <= 0) return 0;
  const int64_t slab = std::min(num_chunks_of(p, chunk_size), kSlabChunks);
  return sizeof(float) * slab * p.num_heads * record_floats(padded_dim(p.head_dim));
}

void kda_chunked(const KdaParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                 int64_t chunk_size, int v_slice) {
  check_cuda_kda_params(p, "kda_chunked");
  check_chunk_size(chunk_size);
  if (p.num_tokens == 0) return;
  const size_t need = kda_chunked_workspace_bytes(p, chunk_size);
  CHECK(workspace != nullptr && workspace_bytes >= need, "kda_chunked: workspace of ",
        workspace_bytes, " bytes, need ", need);
  CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
        "kda_chunked: workspace is not 256-byte aligned");
  const int kp = padded_dim(p.head_dim);
  CHECK(v_slice == 0 || v_slice == 16 || v_slice == 32 || v_slice == 64,
        "kda_chunked: v_slice = ", v_slice, " (0, 16, 32 or 64)");
  const int slice = v_slice != 0 ? v_slice : pick_slice(p.num_heads, kp);
  const size_t intra_smem = intra_shared_bytes(kp);
  const size_t inter_smem = inter_shared_bytes(kp, slice);
  CUDA_CHECK(cudaFuncSetAttribute(intra_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(intra_smem)));
  const auto inter = slice == 64   ? inter_chunk_kernel<64>
                     : slice == 32 ? inter_chunk_kernel<32>
                                   : inter_chunk_kernel<16>;
  CUDA_CHECK(cudaFuncSetAttribute(inter, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(inter_smem)));
  float* ws = static_cast<float*>(workspace);
  const int64_t num_chunks = num_chunks_of(p, chunk_size);
  const unsigned num_slices = static_cast<unsigned>((kp + slice - 1) / slice);
  for (int64_t first = 0; first < num_chunks; first += kSlabChunks) {
    const int slab = static_cast<int>(std::min(kSlabChunks, num_chunks - first));
    const int64_t slab_t0 = first * chunk_size;
    intra_chunk_kernel<<<dim3(slab, static_cast<unsigned>(p.num_heads)), kThreads, intra_smem,
                         stream>>>(p, ws, slab_t0, chunk_size, kp);
    CUDA_CHECK_LAUNCH();
    inter<<<dim3(static_cast<unsigned>(p.num_heads), num_slices), kThreads, inter_smem, stream>>>(
        p, ws, slab_t0, slab, chunk_size, kp);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace hyserve::cuda
