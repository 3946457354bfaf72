// The flash kernel of dense MLA prefill (mla_flash_prefill.cu) on Hopper's warpgroup MMAs:
// one chunk's keys, expanded to K [H, chunk, 192] and V [H, chunk, 128] bf16, attended by
// blocks of 128 queries of one head.
//
// Block (128 queries, head): two warpgroups, warpgroup w the queries [64w, 64w + 64) of the
// block; one block per SM. Q lives in registers as the MMAs' A fragments (48 a thread: 12
// k-steps of 16 dims), loaded once; only K and V go through shared memory, from a 1,024-aligned
// base, 128-byte swizzled in column blocks of 64 dims (128 bytes of bf16: wgmma.cuh):
//   k      [3 stages][3 blocks][64 keys][128 B]       a tile of K
//   v      [3 stages][2 blocks][64 keys][128 B]       the same keys' V
//   pos    [128] int64                                 each query's position
// Per tile of 64 keys (the next two tiles' K and V on their way by cp.async):
//   QK       warpgroup w: S = Q K^T, 12 MMAs m64n64k16, A = Q from registers, B = the k tile
//            (K-major)
//   softmax  online in base 2 in the accumulators' registers (a thread holds 2 rows x 16
//            keys), causal mask per row; a warpgroup none of whose rows sees the tile
//            skips it
//   PV       O[64 x 128] += P . v, 4 MMAs m64n128k16, A = P from registers (two
//            neighbouring n-tiles of S, rounded to bf16, are an A fragment), B = the v tile
//            read N-major (its rows are keys with the dims contiguous). O lives in 64
//            registers per thread.
// With both A operands in registers an MMA reads only B from shared memory: 64 bytes a
// clock at the MMA's rate, half of what shared memory gives (both operands from shared memory
// at N = 64 would need all of it). One block barrier per tile: the tile landed (every thread's
// cp.async waited and fenced for the async proxy) and both warpgroups are done with the tile
// two before it, whose stage the next loads reuse.
//
// The numerics are the mma.sync kernel's (q, K, V and P rounded to bf16, fp32 accumulation,
// the row sums of the fp32 probabilities), and so is the state carried between chunks in
// `out` and `ml`: the tests hold both kernels to the same tolerances.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/cp_async.cuh"
#include "core/cuda/mma_sync.cuh"
#include "core/cuda/wgmma.cuh"
#include "kernels/attention/mla/cuda/mla_flash_args.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kRows = kFlashWgmmaRows;
constexpr int kKeys = 64;
constexpr int kDqk = 192;
constexpr int kDv = 128;
constexpr int kQkBlocks = kDqk / 64;  // 3 column blocks of 64 dims
constexpr int kVBlocks = kDv / 64;    // 2
constexpr int kKSteps = kDqk / 16;    // 12 k-steps of QK
constexpr int kKPanel = kKeys * 128;  // one column block of a k or v tile: 8 KB
constexpr int kKStage = kQkBlocks * kKPanel;
constexpr int kVStage = kVBlocks * kKPanel;
constexpr int kStages = 3;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kRows == 2 * 64, "a warpgroup of 64 rows each");

struct Smem {
  static constexpr int kK = 0;
  static constexpr int kV = kK + kStages * kKStage;
  static constexpr int kPos = kV + kStages * kVStage;
  static constexpr int kBytes = kPos + kRows * 8;
  static constexpr int kAllocated = kBytes + 1024;  // + the base's alignment
};
static_assert(Smem::kAllocated <= 227 * 1024, "above the H100/H200 block limit");

// Keys [it * 64, it * 64 + 64) of the chunk into a stage (the caller commits the group); rows
// past kc are zeros.
// Consecutive threads take consecutive 16-byte pieces of a key's row (384 bytes of K, 256
// of V): whole sectors.
__device__ __forceinline__ void load_tile(const FlashArgs& a, int64_t h, int it, uint8_t* k_s,
                                          uint8_t* v_s) {
  const int64_t key0 = static_cast<int64_t>(it) * kKeys;
  const bf16* kg = a.k + (h * a.chunk_keys + key0) * kDqk;
  const bf16* vg = a.v + (h * a.chunk_keys + key0) * kDv;
  constexpr int kKPieces = kDqk / 8, kVPieces = kDv / 8;
  for (int i = threadIdx.x; i < kKeys * kKPieces; i += kThreads) {
    const int r = i / kKPieces, piece = i % kKPieces;
    const bool live = key0 + r < a.kc;
    cp_async_16(sw128_chunk(k_s + (piece / 8) * kKPanel, r, piece % 8),
                live ? kg + r * kDqk + piece * 8 : a.k, live ? 16 : 0);
  }
  for (int i = threadIdx.x; i < kKeys * kVPieces; i += kThreads) {
    const int r = i / kVPieces, piece = i % kVPieces;
    const bool live = key0 + r < a.kc;
    cp_async_16(sw128_chunk(v_s + (piece / 8) * kKPanel, r, piece % 8),
                live ? vg + r * kDv + piece * 8 : a.v, live ? 16 : 0);
  }
}

__global__ void __launch_bounds__(kThreads, 1) flash_wgmma_kernel(FlashArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint8_t* k_s = smem + Smem::kK;
  uint8_t* v_s = smem + Smem::kV;
  auto* pos_s = reinterpret_cast<int64_t*>(smem + Smem::kPos);

  const int group = threadIdx.x / 128;  // warpgroup
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, quad = lane % 4;
  // The longest rows (the last queries) first.
  const int64_t t0 = (static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x) * kRows;
  const int64_t h = blockIdx.y;

  if (threadIdx.x < kRows) {
    const int64_t t = t0 + threadIdx.x;
    pos_s[threadIdx.x] = t < a.num_tokens ? a.q_pos[t] : -1;
  }
  __syncthreads();

  // Keys of the chunk some row of the block sees: [k0, k0 + n); the last position of this
  // warpgroup's rows (a tile past it is skipped by the warpgroup).
  int64_t max_pos = -1, group_max_pos = -1;
  for (int r = 0; r < kRows; ++r) {
    max_pos = pos_s[r] > max_pos ? pos_s[r] : max_pos;
    if (r / 64 == group) group_max_pos = pos_s[r] > group_max_pos ? pos_s[r] : group_max_pos;
  }
  int64_t n = a.kc < max_pos + 1 - a.k0 ? a.kc : max_pos + 1 - a.k0;
  if (n < 0) n = 0;
  const int num_tiles = static_cast<int>((n + kKeys - 1) / kKeys);

  // This thread's rows of the block: r0 (accumulator entries 4j, 4j + 1) and r0 + 8 (4j + 2,
  // 4j + 3); columns 8j + 2 quad (+1): keys of a tile for S, dims for O.
  const int r_lo = 64 * group + 16 * warp + g;
  const int64_t pos[2] = {pos_s[r_lo], pos_s[r_lo + 8]};
  const int64_t row[2] = {t0 + r_lo, t0 + r_lo + 8};

  // This thread's A fragments of Q (rounded to bf16) for the 12 k-steps: rows r_lo and
  // r_lo + 8, dims 16 ks + 2 quad (+1) and +8 (+9); zero past q_width and past T.
  uint32_t qa[kKSteps][4];
  {
    const float* q_row[2] = {nullptr, nullptr};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (row[half] < a.num_tokens) q_row[half] = a.q + (row[half] * a.num_heads + h) * a.q_width;
    }
    auto at = [&](int half, int col) {
      return q_row[half] != nullptr && col < a.q_width ? q_row[half][col] : 0.0f;
    };
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int c0 = 16 * ks + 2 * quad;
      qa[ks][0] = pack_bf16x2(at(0, c0), at(0, c0 + 1));
      qa[ks][1] = pack_bf16x2(at(1, c0), at(1, c0 + 1));
      qa[ks][2] = pack_bf16x2(at(0, c0 + 8), at(0, c0 + 9));
      qa[ks][3] = pack_bf16x2(at(1, c0 + 8), at(1, c0 + 9));
    }
  }

  float o[kDv / 2];
#pragma unroll
  for (int e = 0; e < kDv / 2; ++e) o[e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (!a.first) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (row[half] >= a.num_tokens) continue;
      const int64_t rh = row[half] * a.num_heads + h;
      m[half] = a.ml[rh * 2];
      l[half] = quad == 0 ? a.ml[rh * 2 + 1] : 0.0f;  // the quad sums its partials at the end
      const float* o_row = a.out + rh * a.dv;
#pragma unroll
      for (int j = 0; j < kDv / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = j * 8 + 2 * quad + e;
          if (col < a.dv) o[4 * j + 2 * half + e] = o_row[col];
        }
      }
    }
  }

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_tiles) load_tile(a, h, st, k_s + st * kKStage, v_s + st * kVStage);
    cp_async_commit();
  }
  const int64_t k_end = a.k0 + a.kc;
  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % kStages;
    cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();  // tile it landed; tile it - 1 (whose stage the loads below reuse) is done
    const int next = it + kStages - 1;
    if (next < num_tiles) {
      load_tile(a, h, next, k_s + (next % kStages) * kKStage, v_s + (next % kStages) * kVStage);
    }
    cp_async_commit();
    const int64_t key_base = a.k0 + static_cast<int64_t>(it) * kKeys;
    if (key_base > group_max_pos) continue;  // uniform over the warpgroup
    const uint8_t* kt = k_s + stage * kKStage;
    const uint8_t* vt = v_s + stage * kVStage;

    // S = Q K^T over 12 k-steps of 16 dims: block ks / 4, bytes 32 (ks % 4) of every row.
    float s[kKeys / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      wgmma_bf16_rs_n64_kmajor(s, qa[ks], wgmma_desc_sw128(kt + (ks / 4) * kKPanel + (ks % 4) * 32),
                               ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>(s);

    // Mask (key <= the row's position, inside the chunk), scale to log2 units, online softmax.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const int64_t key = key_base + j * 8 + 2 * quad + (e % 2);
        const float x = key < k_end && key <= pos[half] ? s[4 * j + e] * a.scale_log2 : -INFINITY;
        s[4 * j + e] = x;
        tile_max[half] = fmaxf(tile_max[half], x);
      }
    }
    float base[2], corr[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tm = tile_max[half];
      tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
      tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
      const float m_new = fmaxf(m[half], tm);
      base[half] = m_new == -INFINITY ? 0.0f : m_new;
      corr[half] = exp2f(m[half] - base[half]);
      m[half] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < kKeys / 2; ++e) {
      const float pr = exp2f(s[e] - base[(e / 2) % 2]);
      s[e] = pr;
      sum[(e / 2) % 2] += pr;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) l[half] = l[half] * corr[half] + sum[half];
#pragma unroll
    for (int j = 0; j < kDv / 8; ++j) {
      o[4 * j] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }

    // O += P V over 4 k-steps of 16 keys: P's n-tiles 2ks, 2ks + 1 are the A fragment of
    // step ks; B rows 16 ks ..+16 of the v tile (2,048 bytes a step), its two column blocks
    // kKPanel apart.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      pa[ks][0] = pack_bf16x2(s[8 * ks], s[8 * ks + 1]);
      pa[ks][1] = pack_bf16x2(s[8 * ks + 2], s[8 * ks + 3]);
      pa[ks][2] = pack_bf16x2(s[8 * ks + 4], s[8 * ks + 5]);
      pa[ks][3] = pack_bf16x2(s[8 * ks + 6], s[8 * ks + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      wgmma_bf16_rs_n128_nmajor(o, pa[ks], wgmma_desc_sw128_mn(vt + ks * 2048, kKPanel), 1);
    }
    wgmma_commit();
    wgmma_wait<0>(o);
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float total = l[half];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    if (row[half] >= a.num_tokens) continue;
    const int64_t rh = row[half] * a.num_heads + h;
    float* o_row = a.out + rh * a.dv;
    const float inv = a.last ? (total > 0.0f ? 1.0f / total : 0.0f) : 1.0f;
#pragma unroll
    for (int j = 0; j < kDv / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = j * 8 + 2 * quad + e;
        if (col < a.dv) o_row[col] = o[4 * j + 2 * half + e] * inv;
      }
    }
    if (quad != 0) continue;
    if (a.last) {
      if (a.lse != nullptr) {
        a.lse[rh] = total > 0.0f ? (m[half] + log2f(total)) * kLn2 : -INFINITY;
      }
    } else {
      a.ml[rh * 2] = m[half];
      a.ml[rh * 2 + 1] = total;
    }
  }
}

}  // namespace

void launch_flash_wgmma(const FlashArgs& a, cudaStream_t stream) {
  // Set on every launch (cheap): the attribute is per device.
  CUDA_CHECK(cudaFuncSetAttribute(flash_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Smem::kAllocated));
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kRows - 1) / kRows),
                  static_cast<unsigned>(a.num_heads));
  flash_wgmma_kernel<<<grid, kThreads, Smem::kAllocated, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
