// Sparse MLA over the bf16 latent on Hopper's warpgroup MMAs (mla_sparse_wgmma.cuh): the
// attend step of mla_attention_absorbed for top-k calls, one split per query.
//
// The layout and the steps are the DSA kernel's over the FP8 latent (dsa_mla_wgmma.cu) with
// bf16 operands: the bf16 latent rows are what the MMAs take, so they stream into shared
// memory by cp.async with no conversion, and q needs no scale (bf16 has fp32's range).
//
// Block (query t, head group of 64), two warpgroups, one block per SM. Shared memory, from a
// 1,024-aligned base, every matrix 128-byte swizzled in column blocks of 64 dims:
//   q      [9 blocks][64 heads][128 B]          q_abs rounded to bf16
//   k      [2 stages][9 blocks][64 keys][128 B] a tile of 64 listed keys' latents
//   p      [64 heads][128 B]                    the tile's probabilities, bf16
//   maxima and sums [2][64], the tiles' key-valid flags [2][64]
// Per tile of 64 slots of the query's top-k list (the next tile's rows on their way):
//   QK       warpgroup w: logits of all 64 heads x keys [32w, 32w + 32): 36 MMAs m64n32k16
//   softmax  online in base 2, the row maxima exchanged between the warpgroups through
//            shared memory, the probabilities (bf16) written to p
//   PV       warpgroup w: o[64 heads, dims 256w ..+256] += p . k[:, 256w ..+256]: 4 MMAs
//            m64n256k16, B = the same k tile read N-major. o lives in 128 registers a thread.
// Three block barriers a tile: the tile landed (and the one before it is done with), the
// row maxima, p. A tile none of whose slots holds a visible key is skipped (a query's list
// is padded with -1 past its keys).
//
// Numerics: q_abs, the latent and the probabilities are bf16 (the MMAs' inputs, 2^-9
// relative each), every product and sum fp32; the row sums add the bf16 probabilities the
// MMA uses. The partials (max in natural-log units, sum, unnormalized o_lat) are what
// mla_absorbed.cu's combine reads for one split.
#include "kernels/attention/mla/cuda/mla_sparse_wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/cp_async.cuh"
#include "core/cuda/mma_sync.cuh"
#include "core/cuda/wgmma.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kHeads = kMlaSparseHeads;
constexpr int kKeys = 64;
constexpr int kDimBlocks = kMlaSparseWidth / 64;           // 9 column blocks of 64 dims
constexpr int kPanelBytes = 64 * 128;                      // one column block of 64 rows
constexpr int kTileBytes = kDimBlocks * kPanelBytes;       // 72 KB
constexpr int kPiecesPerRow = kMlaSparseWidth * 2 / 16;    // 72 16-byte pieces of a row
constexpr int kPieces = kKeys * kPiecesPerRow / kThreads;  // a thread's pieces of a tile: 18
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kKeys * kPiecesPerRow % kThreads == 0, "whole pieces per thread");
static_assert(kHeads == 64 && kKeys == 64, "one wgmma M and two N halves per tile");

struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kTileBytes;
  static constexpr int kP = kK + 2 * kTileBytes;
  static constexpr int kMax = kP + kPanelBytes;         // [2][64] float
  static constexpr int kSum = kMax + 2 * kHeads * 4;    // [2][64] float
  static constexpr int kValid = kSum + 2 * kHeads * 4;  // [2 stages][64] int
  static constexpr int kBytes = kValid + 2 * kKeys * 4;
  static constexpr int kAllocated = kBytes + 1024;  // + the base's alignment
};
static_assert(Smem::kAllocated <= 227 * 1024, "above the H100/H200 block limit");

__global__ void __launch_bounds__(kThreads, 1) sparse_wgmma_kernel(MlaSparseWgmmaArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint8_t* q_s = smem + Smem::kQ;
  uint8_t* k_s = smem + Smem::kK;
  uint8_t* p_s = smem + Smem::kP;
  auto* max_s = reinterpret_cast<float*>(smem + Smem::kMax);
  auto* sum_s = reinterpret_cast<float*>(smem + Smem::kSum);
  auto* valid_s = reinterpret_cast<int*>(smem + Smem::kValid);

  const int64_t num_groups = (a.num_heads + kHeads - 1) / kHeads;
  const int64_t t = blockIdx.x / num_groups;
  const int64_t head0 = (blockIdx.x % num_groups) * kHeads;
  const int group = threadIdx.x / 128;  // warpgroup
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, quad = lane % 4;

  const int64_t q_pos = a.q_pos[t];
  const PagedRows pages = a.pages.for_query(t, a.table_stride);
  const int32_t* list = a.topk + t * a.topk_width;
  const int num_tiles = static_cast<int>((a.topk_width + kKeys - 1) / kKeys);

  // Tile k's rows into stage `stage`: piece c = tid + 256 j is piece c % 72 of key c / 72
  // (a warp's 32 pieces are 512 contiguous bytes of one or two rows); a slot that holds no
  // visible key loads zeros and is flagged invalid. Returns whether any key whose first piece
  // this thread loaded is visible.
  auto load_tile = [&](int k, int stage) {
    bool any = false;
    uint8_t* dst = k_s + stage * kTileBytes;
    int* valid = valid_s + stage * kKeys;
#pragma unroll 6
    for (int j = 0; j < kPieces; ++j) {
      const int c = static_cast<int>(threadIdx.x) + kThreads * j;
      const int key = c / kPiecesPerRow, piece = c % kPiecesPerRow;
      const int64_t slot = int64_t{k} * kKeys + key;
      const int64_t s = slot < a.topk_width ? int64_t{list[slot]} : -1;
      const bool ok = s >= 0 && s < a.num_keys && s <= q_pos;
      const bf16* src = ok ? pages.row(a.latent, s, kMlaSparseWidth) + piece * 8 : a.latent;
      cp_async_16(sw128_chunk(dst + (piece / 8) * kPanelBytes, key, piece % 8), src, ok ? 16 : 0);
      if (piece == 0) {
        valid[key] = ok ? 1 : 0;
        any = any || ok;
      }
    }
    cp_async_commit();
    return any;
  };

  bool any_next = false;
  if (num_tiles > 0) any_next = load_tile(0, 0);

    // q rows -> bf16: piece c = tid + 256 j is dims [8 (c % 72), +8) of head row c / 72; heads
    // past num_heads (a last group of fewer than 64) are zero rows, their outputs not written.
#pragma unroll 6
  for (int j = 0; j < kPieces; ++j) {
    const int c = static_cast<int>(threadIdx.x) + kThreads * j;
    const int r = c / kPiecesPerRow, piece = c % kPiecesPerRow;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (head0 + r < a.num_heads) {
      const auto* src = reinterpret_cast<const float4*>(
          a.q_abs + (t * a.num_heads + head0 + r) * kMlaSparseWidth + piece * 8);
      const float4 x0 = src[0], x1 = src[1];
      v = make_uint4(pack_bf16x2(x0.x, x0.y), pack_bf16x2(x0.z, x0.w), pack_bf16x2(x1.x, x1.y),
                     pack_bf16x2(x1.z, x1.w));
    }
    *reinterpret_cast<uint4*>(sw128_chunk(q_s + (piece / 8) * kPanelBytes, r, piece % 8)) = v;
  }
  fence_proxy_async();

  // Rows of this thread's accumulators: r0 = 16 warp + g (d[4n], d[4n + 1]) and r0 + 8
  // (d[4n + 2], d[4n + 3]); QK columns are keys 32 group + 8n + 2 quad (+1), PV columns dims
  // 256 group + 8n + 2 quad (+1).
  const int r0 = 16 * warp + g;
  const int r1 = r0 + 8;
  float o[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) o[e] = 0.0f;
  float run_max0 = -INFINITY, run_max1 = -INFINITY;
  float run_sum0 = 0.0f, run_sum1 = 0.0f;  // this thread's columns only

  for (int k = 0; k < num_tiles; ++k) {
    const int stage = k & 1;
    cp_async_wait<0>();
    fence_proxy_async();
    // Tile k landed for every thread, the tile before it is done with (its stage and p are
    // free); whether any of tile k's slots holds a visible key.
    const bool any = __syncthreads_or(any_next ? 1 : 0) != 0;
    if (k + 1 < num_tiles) any_next = load_tile(k + 1, stage ^ 1);
    if (!any) continue;  // uniform over the block
    const uint8_t* kt = k_s + stage * kTileBytes;
    const int* valid = valid_s + stage * kKeys;

    // QK over 36 k-steps of 16 dims: block st / 4, bytes 32 (st % 4) of every row.
    float s[16];
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < kMlaSparseWidth / 16; ++st) {
      const int off = (st / 4) * kPanelBytes + (st % 4) * 32;
      wgmma_bf16<32>(s, wgmma_desc_sw128(q_s + off), wgmma_desc_sw128(kt + off + group * 32 * 128),
                     st > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>(s);

    // Softmax: logits in base 2, invalid keys -inf; the tile's row maxima of both halves.
    float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int key = 32 * group + 8 * n + 2 * quad;
      const bool v0 = valid[key] != 0, v1 = valid[key + 1] != 0;
      s[4 * n] = v0 ? s[4 * n] * a.scale_log2 : -INFINITY;
      s[4 * n + 1] = v1 ? s[4 * n + 1] * a.scale_log2 : -INFINITY;
      s[4 * n + 2] = v0 ? s[4 * n + 2] * a.scale_log2 : -INFINITY;
      s[4 * n + 3] = v1 ? s[4 * n + 3] * a.scale_log2 : -INFINITY;
      m0 = fmaxf(m0, fmaxf(s[4 * n], s[4 * n + 1]));
      m1 = fmaxf(m1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    if (quad == 0) {
      max_s[group * kHeads + r0] = m0;
      max_s[group * kHeads + r1] = m1;
    }
    __syncthreads();  // row maxima
    const float new0 = fmaxf(run_max0, fmaxf(max_s[r0], max_s[kHeads + r0]));
    const float new1 = fmaxf(run_max1, fmaxf(max_s[r1], max_s[kHeads + r1]));
    const float corr0 = new0 == -INFINITY ? 1.0f : exp2f(run_max0 - new0);
    const float corr1 = new1 == -INFINITY ? 1.0f : exp2f(run_max1 - new1);
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int key = 32 * group + 8 * n + 2 * quad;
      const __nv_bfloat162 p0 =
          new0 == -INFINITY
              ? __floats2bfloat162_rn(0.0f, 0.0f)
              : __floats2bfloat162_rn(exp2f(s[4 * n] - new0), exp2f(s[4 * n + 1] - new0));
      const __nv_bfloat162 p1 =
          new1 == -INFINITY
              ? __floats2bfloat162_rn(0.0f, 0.0f)
              : __floats2bfloat162_rn(exp2f(s[4 * n + 2] - new1), exp2f(s[4 * n + 3] - new1));
      sum0 += __low2float(p0) + __high2float(p0);
      sum1 += __low2float(p1) + __high2float(p1);
      *reinterpret_cast<__nv_bfloat162*>(p_s + sw128_offset(r0, 2 * key)) = p0;
      *reinterpret_cast<__nv_bfloat162*>(p_s + sw128_offset(r1, 2 * key)) = p1;
    }
    run_sum0 = run_sum0 * corr0 + sum0;
    run_sum1 = run_sum1 * corr1 + sum1;
    run_max0 = new0;
    run_max1 = new1;
    if (corr0 != 1.0f || corr1 != 1.0f) {
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[4 * n] *= corr0;
        o[4 * n + 1] *= corr0;
        o[4 * n + 2] *= corr1;
        o[4 * n + 3] *= corr1;
      }
    }
    fence_proxy_async();
    __syncthreads();  // p written

    // PV over 4 k-steps of 16 keys: A bytes 32 ks of every p row; B rows 16 ks ..+16 of the
    // tile (2,048 bytes a step), this warpgroup's 4 column blocks kPanelBytes apart.
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      wgmma_bf16_n256_nmajor(
          o, wgmma_desc_sw128(p_s + 32 * ks),
          wgmma_desc_sw128_mn(kt + 4 * group * kPanelBytes + ks * 2048, kPanelBytes), 1);
    }
    wgmma_commit();
    wgmma_wait<0>(o);
  }

  // Partials: the row sums over the 4 lanes of a row and both warpgroups; o straight from the
  // accumulators; the max in natural-log units (the combine's).
  run_sum0 += __shfl_xor_sync(0xffffffffu, run_sum0, 1);
  run_sum0 += __shfl_xor_sync(0xffffffffu, run_sum0, 2);
  run_sum1 += __shfl_xor_sync(0xffffffffu, run_sum1, 1);
  run_sum1 += __shfl_xor_sync(0xffffffffu, run_sum1, 2);
  if (quad == 0) {
    sum_s[group * kHeads + r0] = run_sum0;
    sum_s[group * kHeads + r1] = run_sum1;
  }
  __syncthreads();
  const bool ok0 = head0 + r0 < a.num_heads, ok1 = head0 + r1 < a.num_heads;
  const int64_t row0 = t * a.num_heads + head0 + r0;
  const int64_t row1 = t * a.num_heads + head0 + r1;
  if (group == 0 && quad == 0) {
    if (ok0) {
      a.part_ml[row0 * 2] = run_max0 * kLn2;
      a.part_ml[row0 * 2 + 1] = sum_s[r0] + sum_s[kHeads + r0];
    }
    if (ok1) {
      a.part_ml[row1 * 2] = run_max1 * kLn2;
      a.part_ml[row1 * 2 + 1] = sum_s[r1] + sum_s[kHeads + r1];
    }
  }
  float* out0 = a.part_o + row0 * kMlaSparseLora + 256 * group + 2 * quad;
  float* out1 = a.part_o + row1 * kMlaSparseLora + 256 * group + 2 * quad;
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    if (ok0) *reinterpret_cast<float2*>(out0 + 8 * n) = make_float2(o[4 * n], o[4 * n + 1]);
    if (ok1) *reinterpret_cast<float2*>(out1 + 8 * n) = make_float2(o[4 * n + 2], o[4 * n + 3]);
  }
}

}  // namespace

void launch_mla_sparse_wgmma(const MlaSparseWgmmaArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return;
  CUDA_CHECK(cudaFuncSetAttribute(sparse_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Smem::kAllocated));
  const int64_t groups = (a.num_heads + kHeads - 1) / kHeads;
  sparse_wgmma_kernel<<<static_cast<unsigned>(a.num_tokens * groups), kThreads, Smem::kAllocated,
                        stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
