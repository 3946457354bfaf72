// Dense MLA prefill in the expanded form on tensor cores (cuda.h, mla_flash_prefill).
//
// Prefill attends every query of a chunk to (almost) every key, so the absorbed form's
// 2 (kv_lora + dr) + 2 kv_lora FLOPs per (query, key, head) cost 3.4x the expanded form's
// 2 (dn + dr) + 2 dv at K3's sizes (576 + 512 against 192 + 128). The keys are expanded
// once per call, per chunk of keys, and attended flash-style:
//
//   kv_b -> bf16 [H*(dn+dv), kv_lora]           as stored when BF16, else decoded once
//   per chunk of keys [k0, k0 + kc):
//     prep_keys_kernel   latent rows -> c bf16 [kc, kv_lora]; k_pe into each head's K rows,
//                        zeros in the padding of K and V
//     K[h] = c W_UK(h)^T   cuBLAS strided batched, bf16 out  [H][chunk][kDqk] = [k_nope|k_pe|0]
//     V[h] = c W_UV(h)^T   cuBLAS strided batched, bf16 out  [H][chunk][kDv]  = [v|0]
//     flash_kernel       block per (64 or 128 queries, head), a warp per 16 queries: Q
//                        [16, kDqk] bf16 in each warp's registers, K and
//                        V tiles of 64 keys through shared memory (cp.async, two stages),
//                        S = Q K^T and O += P V on mma.sync (fp32 accumulate), the online
//                        softmax in registers (exp2, causal mask per row)
//   Between chunks the running state stays in `out` (unnormalized O) and the workspace's
//   (max, sum) per row; the last chunk normalizes and writes lse.
//
// Workspace (each part 256-byte aligned): kv_b bf16 | c [chunk, kv_lora] | K [H, chunk, kDqk]
// | V [H, chunk, kDv] | ml [T*H, 2]. chunk = the keys whose K and V fit kKvChunkBytes.
//
// Precision: q, the latent, kv_b, K, V and P are rounded to bf16 (the MMAs' inputs), every
// product summed in fp32; the row sums add the fp32 probabilities.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "core/cuda/cp_async.cuh"
#include "core/cuda/mma_sync.cuh"
#include "kernels/attention/mla/check.h"
#include "kernels/attention/mla/cuda.h"
#include "kernels/attention/mla/cuda/mla_flash_args.cuh"
#include "kernels/linear/cuda/dequant.cuh"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

using bf16 = __nv_bfloat16;

// A block: kWarps warps of 16 query rows each, one head (64 or 128 queries).
constexpr int kMaxBlockRows = 128;
constexpr int kTileKeys = 64;  // keys per shared-memory tile
constexpr int kPad = 8;        // bf16 of padding per shared row: conflict-free ldmatrix
constexpr size_t kKvChunkBytes = size_t{128} << 20;
constexpr int64_t kMaxChunkKeys = 16384;
constexpr size_t kAlign = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The padded head sizes a call runs at: q/k width dn + dr and value width dv, each rounded
// up to one of the compiled variants; {0, 0} when none holds them.
struct Variant {
  int dqk = 0, dv = 0;
};

Variant pick_variant(const MlaAttentionParams& p) {
  if (p.dn + p.dr <= 64 && p.dv <= 64) return {64, 64};
  if (p.dn + p.dr <= 192 && p.dv <= 128) return {192, 128};
  return {};
}

struct FlashPlan {
  Variant v;
  int64_t chunk_keys = 0;
  size_t kv_b_bytes = 0, c_bytes = 0, k_bytes = 0, v_bytes = 0, ml_bytes = 0;
  size_t total_bytes() const { return kv_b_bytes + c_bytes + k_bytes + v_bytes + ml_bytes; }
};

FlashPlan make_flash_plan(const MlaAttentionParams& p, int64_t max_chunk_keys) {
  FlashPlan f;
  f.v = pick_variant(p);
  if (f.v.dqk == 0) return f;
  const int64_t per_key = 2 * p.num_heads * (f.v.dqk + f.v.dv);
  f.chunk_keys = static_cast<int64_t>(kKvChunkBytes) / per_key;
  if (max_chunk_keys > 0) f.chunk_keys = std::min(f.chunk_keys, max_chunk_keys);
  f.chunk_keys =
      std::clamp<int64_t>(f.chunk_keys / kTileKeys * kTileKeys, kTileKeys, kMaxChunkKeys);
  f.kv_b_bytes = align_up(sizeof(bf16) * p.num_heads * (p.dn + p.dv) * p.kv_lora);
  f.c_bytes = align_up(sizeof(bf16) * f.chunk_keys * p.kv_lora);
  f.k_bytes = align_up(sizeof(bf16) * p.num_heads * f.chunk_keys * f.v.dqk);
  f.v_bytes = align_up(sizeof(bf16) * p.num_heads * f.chunk_keys * f.v.dv);
  f.ml_bytes = align_up(sizeof(float) * 2 * p.num_tokens * p.num_heads);
  return f;
}

template <WFmt F>
__global__ void kv_b_to_bf16_kernel(WRef w, bf16* __restrict__ out) {
  const int64_t n = w.rows * w.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(element<F>(w, i / w.cols, i % w.cols));
  }
}

__device__ __forceinline__ float widen(float v) {
  return v;
}
__device__ __forceinline__ float widen(bf16 v) {
  return __bfloat162float(v);
}

// Block per key j of the chunk: c[j] = its latent's first kv_lora values; every head's K row
// gets k_pe at [dn, dn + dr) and zeros to kDqk, every V row zeros at [dv, kDv).
template <typename L>
__global__ void prep_keys_kernel(PagedRows pages, const L* latent, int64_t k0, int64_t kv_lora,
                                 int64_t dn, int64_t dr, int64_t dv, int64_t heads,
                                 int64_t chunk_keys, int dqk, int dv_pad, bf16* __restrict__ c,
                                 bf16* __restrict__ k, bf16* __restrict__ v) {
  const int64_t j = blockIdx.x;
  const L* row = pages.row(latent, k0 + j, kv_lora + dr);
  for (int64_t i = threadIdx.x; i < kv_lora; i += blockDim.x) {
    c[j * kv_lora + i] = __float2bfloat16(widen(row[i]));
  }
  const int64_t k_tail = dqk - dn;
  for (int64_t i = threadIdx.x; i < heads * k_tail; i += blockDim.x) {
    const int64_t h = i / k_tail, e = i % k_tail;
    k[(h * chunk_keys + j) * dqk + dn + e] =
        e < dr ? __float2bfloat16(widen(row[kv_lora + e])) : __float2bfloat16(0.0f);
  }
  const int64_t v_tail = dv_pad - dv;
  for (int64_t i = threadIdx.x; i < heads * v_tail; i += blockDim.x) {
    const int64_t h = i / v_tail, e = i % v_tail;
    v[(h * chunk_keys + j) * dv_pad + dv + e] = __float2bfloat16(0.0f);
  }
}

template <int kDqk, int kDv, int kWarps>
struct FlashShape {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockRows = 16 * kWarps;
  static constexpr int kLdQk = kDqk + kPad;
  static constexpr int kLdV = kDv + kPad;
  static constexpr size_t kSmemBytes =
      sizeof(bf16) * (kBlockRows * kLdQk + 2 * kTileKeys * kLdQk + 2 * kTileKeys * kLdV);
};

// Keys [it * 64, it * 64 + 64) of the chunk into stage `buf`; rows past kc are zeros.
template <class S, int kDqk, int kDv>
__device__ __forceinline__ void load_kv_tile(const FlashArgs& a, int64_t h, int it, bf16* k_s,
                                             bf16* v_s) {
  const int64_t key0 = static_cast<int64_t>(it) * kTileKeys;
  const bf16* kg = a.k + (h * a.chunk_keys + key0) * kDqk;
  const bf16* vg = a.v + (h * a.chunk_keys + key0) * kDv;
  constexpr int kKChunks = kDqk / 8, kVChunks = kDv / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < kTileKeys * kKChunks; i += S::kThreads) {
    const int r = i / kKChunks, piece = i % kKChunks;
    const bool live = key0 + r < a.kc;
    cp_async_16(k_s + r * S::kLdQk + piece * 8, live ? kg + r * kDqk + piece * 8 : a.k,
                live ? 16 : 0);
  }
  for (int i = threadIdx.x; i < kTileKeys * kVChunks; i += S::kThreads) {
    const int r = i / kVChunks, piece = i % kVChunks;
    const bool live = key0 + r < a.kc;
    cp_async_16(v_s + r * S::kLdV + piece * 8, live ? vg + r * kDv + piece * 8 : a.v,
                live ? 16 : 0);
  }
  cp_async_commit();
}

template <int kDqk, int kDv, int kWarps>
__global__ void __launch_bounds__(32 * kWarps) flash_kernel(FlashArgs a) {
  using S = FlashShape<kDqk, kDv, kWarps>;
  constexpr int kBlockRows = S::kBlockRows;
  constexpr int kKSteps = kDqk / 16;
  constexpr int kVTiles = kDv / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int64_t pos_s[kBlockRows];
  auto* q_s = reinterpret_cast<bf16*>(smem_raw);  // [kBlockRows][kLdQk]
  bf16* k_s = q_s + kBlockRows * S::kLdQk;        // [2][64 keys][kLdQk]
  bf16* v_s = k_s + 2 * kTileKeys * S::kLdQk;     // [2][64][kLdV]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, quad = lane % 4;
  // The longest rows (the last queries) first.
  const int64_t t0 = (static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x) * kBlockRows;
  const int64_t h = blockIdx.y;

  if (threadIdx.x < kBlockRows) {
    const int64_t t = t0 + threadIdx.x;
    pos_s[threadIdx.x] = t < a.num_tokens ? a.q_pos[t] : -1;
  }
  for (int i = threadIdx.x; i < kBlockRows * kDqk; i += S::kThreads) {
    const int r = i / kDqk, col = i % kDqk;
    const int64_t t = t0 + r;
    float x = 0.0f;
    if (t < a.num_tokens && col < a.q_width) x = a.q[(t * a.num_heads + h) * a.q_width + col];
    q_s[r * S::kLdQk + col] = __float2bfloat16(x);
  }
  __syncthreads();

  int64_t max_pos = -1;
  for (int r = 0; r < kBlockRows; ++r) max_pos = pos_s[r] > max_pos ? pos_s[r] : max_pos;
  // Keys of the chunk some row of the block sees: [k0, k0 + n).
  int64_t n = a.kc < max_pos + 1 - a.k0 ? a.kc : max_pos + 1 - a.k0;
  if (n < 0) n = 0;
  const int num_tiles = static_cast<int>((n + kTileKeys - 1) / kTileKeys);

  const int r_lo = warp * 16 + g;
  const int64_t pos[2] = {pos_s[r_lo], pos_s[r_lo + 8]};
  const int64_t row[2] = {t0 + r_lo, t0 + r_lo + 8};

  float o[kVTiles][4];
#pragma unroll
  for (int j = 0; j < kVTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
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
      for (int j = 0; j < kVTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = j * 8 + 2 * quad + e;
          if (col < a.dv) o[j][half * 2 + e] = o_row[col];
        }
      }
    }
  }

  uint32_t qf[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    ldmatrix_x4(qf[kk], q_s + (warp * 16 + lane % 16) * S::kLdQk + kk * 16 + (lane / 16) * 8);
  }

  if (num_tiles > 0) load_kv_tile<S, kDqk, kDv>(a, h, 0, k_s, v_s);
  const int64_t k_end = a.k0 + a.kc;
  for (int it = 0; it < num_tiles; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < num_tiles) {
      load_kv_tile<S, kDqk, kDv>(a, h, it + 1, k_s + (buf ^ 1) * kTileKeys * S::kLdQk,
                                 v_s + (buf ^ 1) * kTileKeys * S::kLdV);
    }
    const bf16* kt = k_s + buf * kTileKeys * S::kLdQk;
    const bf16* vt = v_s + buf * kTileKeys * S::kLdV;

    // S = Q K^T over the tile's 64 keys: 8 n-tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[4];
        ldmatrix_x4(b, kt + (j * 16 + (lane / 16) * 8 + lane % 8) * S::kLdQk + kk * 16 +
                           ((lane / 8) % 2) * 8);
        mma_bf16_16816(s[2 * j], qf[kk], b[0], b[1]);
        mma_bf16_16816(s[2 * j + 1], qf[kk], b[2], b[3]);
      }
    }

    // Mask (key <= the row's position, inside the chunk), scale to log2 units, online softmax.
    const int64_t key_base = a.k0 + static_cast<int64_t>(it) * kTileKeys;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const int64_t key = key_base + j * 8 + 2 * quad + (e % 2);
        const float x = key < k_end && key <= pos[half] ? s[j][e] * a.scale_log2 : -INFINITY;
        s[j][e] = x;
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
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = exp2f(s[j][e] - base[e / 2]);
        s[j][e] = pr;
        sum[e / 2] += pr;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) l[half] = l[half] * corr[half] + sum[half];
#pragma unroll
    for (int j = 0; j < kVTiles; ++j) {
      o[j][0] *= corr[0];
      o[j][1] *= corr[0];
      o[j][2] *= corr[1];
      o[j][3] *= corr[1];
    }

    // O += P V: P's C fragments of n-tiles 2k, 2k+1 are the A fragment of key step k.
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint32_t pa[4] = {pack_bf16x2(s[2 * ks][0], s[2 * ks][1]),
                              pack_bf16x2(s[2 * ks][2], s[2 * ks][3]),
                              pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int jv = 0; jv < kDv / 16; ++jv) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vt + (ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * S::kLdV + jv * 16 +
                                 (lane / 16) * 8);
        mma_bf16_16816(o[2 * jv], pa, b[0], b[1]);
        mma_bf16_16816(o[2 * jv + 1], pa, b[2], b[3]);
      }
    }
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
    for (int j = 0; j < kVTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = j * 8 + 2 * quad + e;
        if (col < a.dv) o_row[col] = o[j][half * 2 + e] * inv;
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

template <int kDqk, int kDv, int kWarps>
void launch_flash(const FlashArgs& a, cudaStream_t stream) {
  using S = FlashShape<kDqk, kDv, kWarps>;
  // Set on every launch (cheap): the attribute is per device.
  CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<kDqk, kDv, kWarps>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(S::kSmemBytes)));
  const dim3 grid(static_cast<unsigned>((a.num_tokens + S::kBlockRows - 1) / S::kBlockRows),
                  static_cast<unsigned>(a.num_heads));
  flash_kernel<kDqk, kDv, kWarps><<<grid, S::kThreads, S::kSmemBytes, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Whether a call runs the warpgroup kernel (cuda.h MlaFlashKernel).
bool uses_wgmma(const MlaFlashOptions& options, Variant v) {
  static const bool env_on = [] {
    const char* env = std::getenv("HYSERVE_MLA_FLASH_WGMMA");
    return env != nullptr && std::string_view(env) == "1";
  }();
  switch (options.kernel) {
    case MlaFlashKernel::kMmaSync:
      return false;
    case MlaFlashKernel::kWgmma:
      CHECK(v.dqk == 192, "mla_flash_prefill: the warpgroup kernel takes the 192/128 heads only");
      return true;
    case MlaFlashKernel::kAuto:
      break;
  }
  return env_on && v.dqk == 192;
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + 255) / 256, 1, 4096));
}

}  // namespace

bool mla_flash_prefill_supports(const MlaAttentionParams& p) {
  return p.topk == nullptr && p.table_stride == 0 && p.lora_slots == nullptr &&
         pick_variant(p).dqk != 0 && p.num_heads < 65536 &&
         (p.num_tokens + kMaxBlockRows - 1) / 16 < (int64_t{1} << 31);
}

size_t mla_flash_prefill_workspace_bytes(const MlaAttentionParams& p,
                                         const MlaFlashOptions& options) {
  return pick_variant(p).dqk != 0 ? make_flash_plan(p, options.max_chunk_keys).total_bytes() : 0;
}

void mla_flash_prefill(const MlaAttentionParams& p, void* workspace, size_t workspace_bytes,
                       const Blas& blas, cudaStream_t stream, const MlaFlashOptions& options) {
  validate(p);
  CHECK(mla_flash_prefill_supports(p),
        "mla_flash_prefill: dense calls with one block table and no kv_b adapter, dn + dr <= 192 "
        "and dv <= 128 only (dn ",
        p.dn, ", dr ", p.dr, ", dv ", p.dv, ")");
  CHECK(blas.stream() == stream, "mla_flash_prefill: the cuBLAS handle runs on another stream");
  if (p.num_tokens == 0) return;
  CHECK(options.block_rows == 0 || options.block_rows == 64 || options.block_rows == 128,
        "mla_flash_prefill: block_rows ", options.block_rows, " (64 or 128)");
  const FlashPlan f = make_flash_plan(p, options.max_chunk_keys);
  CHECK(options.block_rows != 128 || f.v.dqk == 192,
        "mla_flash_prefill: 128-query blocks for the 192/128 heads only");
  const bool wgmma = uses_wgmma(options, f.v);
  CHECK(!wgmma || options.block_rows == 0 || options.block_rows == kFlashWgmmaRows,
        "mla_flash_prefill: the warpgroup kernel runs blocks of ", kFlashWgmmaRows, " queries");
  CHECK(workspace != nullptr && workspace_bytes >= f.total_bytes(), "MLA flash workspace of ",
        workspace_bytes, " bytes, need ", f.total_bytes());
  CHECK(reinterpret_cast<uintptr_t>(workspace) % kAlign == 0,
        "MLA flash workspace must be 256-byte aligned");
  auto* base = static_cast<char*>(workspace);
  auto* kv_b = reinterpret_cast<bf16*>(base);
  auto* c = reinterpret_cast<bf16*>(base + f.kv_b_bytes);
  auto* k = reinterpret_cast<bf16*>(base + f.kv_b_bytes + f.c_bytes);
  auto* v = reinterpret_cast<bf16*>(base + f.kv_b_bytes + f.c_bytes + f.k_bytes);
  auto* ml = reinterpret_cast<float*>(base + f.kv_b_bytes + f.c_bytes + f.k_bytes + f.v_bytes);

  const Weight& w = *p.kv_b;
  const bf16* w_bf16 = kv_b;
  if (w.format == WeightFormat::kDense && w.dtype == DType::kBF16) {
    w_bf16 = static_cast<const bf16*>(w.data);
  } else {
    const WRef ref = make_wref(w);
    dispatch_format(weight_wfmt(w), [&]<WFmt F>() {
      kv_b_to_bf16_kernel<F><<<grid_for(w.rows * w.cols), 256, 0, stream>>>(ref, kv_b);
    });
    CUDA_CHECK_LAUNCH();
  }

  // Keys some query can see (the hint bounds them for a prefill slice).
  int64_t keys = p.num_keys;
  if (p.q_pos_first >= 0) keys = std::min(keys, p.q_pos_first + p.num_tokens);
  keys = std::max<int64_t>(keys, 0);
  const int64_t num_chunks = std::max<int64_t>(1, (keys + f.chunk_keys - 1) / f.chunk_keys);
  const float one = 1.0f, zero = 0.0f;
  for (int64_t ci = 0; ci < num_chunks; ++ci) {
    const int64_t k0 = ci * f.chunk_keys;
    const int64_t kc = std::max<int64_t>(0, std::min(f.chunk_keys, keys - k0));
    if (kc > 0) {
      const auto blocks = static_cast<unsigned>(kc);
      if (p.latent_bf16 != nullptr) {
        prep_keys_kernel<<<blocks, 128, 0, stream>>>(
            p.latent_pages, reinterpret_cast<const bf16*>(p.latent_bf16), k0, p.kv_lora, p.dn, p.dr,
            p.dv, p.num_heads, f.chunk_keys, f.v.dqk, f.v.dv, c, k, v);
      } else {
        prep_keys_kernel<<<blocks, 128, 0, stream>>>(p.latent_pages, p.latent, k0, p.kv_lora, p.dn,
                                                     p.dr, p.dv, p.num_heads, f.chunk_keys, f.v.dqk,
                                                     f.v.dv, c, k, v);
      }
      CUDA_CHECK_LAUNCH();
      // Row-major K[h][s][0, dn) = sum_i c[s][i] W[h (dn + dv) + j][i]: column-major
      // K[h]^T (dn x kc, ld kDqk) = op_T(W_h as kv_lora x dn) * (c as kv_lora x kc). Same for V.
      const int64_t head_stride = (p.dn + p.dv) * p.kv_lora;
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.dn), static_cast<int>(kc),
          static_cast<int>(p.kv_lora), &one, w_bf16, CUDA_R_16BF, static_cast<int>(p.kv_lora),
          head_stride, c, CUDA_R_16BF, static_cast<int>(p.kv_lora), 0, &zero, k, CUDA_R_16BF,
          f.v.dqk, f.chunk_keys * f.v.dqk, static_cast<int>(p.num_heads), CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT));
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.dv), static_cast<int>(kc),
          static_cast<int>(p.kv_lora), &one, w_bf16 + p.dn * p.kv_lora, CUDA_R_16BF,
          static_cast<int>(p.kv_lora), head_stride, c, CUDA_R_16BF, static_cast<int>(p.kv_lora), 0,
          &zero, v, CUDA_R_16BF, f.v.dv, f.chunk_keys * f.v.dv, static_cast<int>(p.num_heads),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    const FlashArgs a{.q = p.q,
                      .q_pos = p.q_pos,
                      .k = k,
                      .v = v,
                      .out = p.out,
                      .lse = p.lse,
                      .ml = ml,
                      .num_tokens = p.num_tokens,
                      .num_heads = p.num_heads,
                      .q_width = p.dn + p.dr,
                      .dv = p.dv,
                      .chunk_keys = f.chunk_keys,
                      .k0 = k0,
                      .kc = kc,
                      .scale_log2 = p.softmax_scale * kLog2e,
                      .first = ci == 0,
                      .last = ci == num_chunks - 1};
    if (wgmma) {
      launch_flash_wgmma(a, stream);
    } else if (f.v.dqk == 64) {
      launch_flash<64, 64, 4>(a, stream);
    } else if (options.block_rows == 64) {
      launch_flash<192, 128, 4>(a, stream);
    } else {
      launch_flash<192, 128, 8>(a, stream);  // the default: 7-12% faster on an H100
    }
  }
}

}  // namespace hyserve::cuda
