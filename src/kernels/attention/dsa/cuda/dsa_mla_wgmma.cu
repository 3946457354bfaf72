// Sparse and dense MLA decode on Hopper's warpgroup MMAs (wgmma f16 x f16 -> f32) for
// groups of 64 heads, the last one padded with zero rows when H is not a multiple of 64
// (dsa_mla.cu plans the splits, merges them and runs the mma.sync kernel for the head
// counts and batches this one does not take).
//
// Block (head group of 64, split, (b, i)), two warpgroups, one block per SM. Shared
// memory, from a 1,024-aligned base, every matrix 128-byte swizzled in column blocks of 64
// dims (128 bytes of fp16: wgmma.cuh):
//   q      [9 blocks][64 heads][128 B]   the query rows, fp16 with a power-of-two scale
//   k      [9 blocks][64 keys][128 B]    the tile's latents converted to fp16 (exact)
//   p      [64 heads][128 B]             the tile's probabilities, fp16
// Per tile of 64 keys (the next tile's codes already in registers, requested one tile
// ahead):
//   convert  every thread turns its key's 9 chunks of 16 codes (one per column block)
//            into fp16 in k (then requests the next tile's codes and fetches the slot
//            id of the one after);
//   QK       warpgroup w: logits of all 64 heads x keys [32w, 32w + 32): 36 MMAs
//            m64n32k16, A = q (K-major), B = its half of k (K-major);
//   softmax  online in base 2, the tile's row maxima exchanged between the warpgroups
//            through shared memory; the probabilities (fp16) written to p;
//   PV       warpgroup w: o[64 heads, dims 256w ..+256] += p . k[:, 256w ..+256]: 4 MMAs
//            m64n256k16, A = p (K-major), B = the same k tile read N-major (its rows
//            are keys with the dims contiguous: the K-major tile of QK is the N-major
//            tile of PV, no copy). o lives in 128 registers per thread.
// Four block barriers per tile: k free (both warpgroups' PV done), k written, the row
// maxima written, p written.
//
// The numerics are those of dsa_mla.cu's kernel (q rounded to fp16 per row with a
// power-of-two scale, latent codes exact in fp16, latent_scale on the logits and in the
// combine, probabilities rounded to fp16 and summed as rounded), so the partials and the
// combine are shared and the tests' tolerances hold for both.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/wgmma.cuh"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "kernels/attention/dsa/cuda/dsa_mla_args.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda::dsa {
namespace {

constexpr int kThreads = 256;  // two warpgroups
constexpr int kHeads = kMlaWgmmaHeads;
constexpr int kKeys = kMlaTileKeys;
constexpr int kDimBlocks = kDsaLatentDim / 64;  // 9 column blocks of 64 dims
constexpr int kPanelBytes = 64 * 128;           // one column block of a 64-row matrix
// Codes: thread tid takes key tid / 4 of a tile and, in each column block j, its
// 16-code chunk 4j + tid % 4 (dims 64j + 16 (tid % 4) ..+16).
constexpr int kThreadsPerKey = 4;
static_assert(kKeys * kThreadsPerKey == kThreads, "one key per 4 threads");
static_assert(kHeads == 64 && kKeys == 64, "one wgmma M and two N halves per tile");
constexpr float kLog2e = 1.4426950408889634f;

struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kDimBlocks * kPanelBytes;
  static constexpr int kP = kK + kDimBlocks * kPanelBytes;
  static constexpr int kMax = kP + kPanelBytes;          // [2][64] float
  static constexpr int kSum = kMax + 2 * kHeads * 4;     // [2][64] float
  static constexpr int kFactor = kSum + 2 * kHeads * 4;  // [64] float
  static constexpr int kValid = kFactor + kHeads * 4;    // [64] int
  static constexpr int kBytes = kValid + kKeys * 4;
  static constexpr int kAllocated = kBytes + 1024;  // + the base's alignment
};
static_assert(Smem::kAllocated <= 227 * 1024, "above the H100/H200 block limit");

__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_kernel(MlaArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint8_t* q_s = smem + Smem::kQ;
  uint8_t* k_s = smem + Smem::kK;
  uint8_t* p_s = smem + Smem::kP;
  float* max_s = reinterpret_cast<float*>(smem + Smem::kMax);
  float* sum_s = reinterpret_cast<float*>(smem + Smem::kSum);
  float* factor_s = reinterpret_cast<float*>(smem + Smem::kFactor);
  int* valid_s = reinterpret_cast<int*>(smem + Smem::kValid);
  start_next_grid();  // the combine's blocks may become resident

  const DsaMlaParams& p = a.p;
  const int64_t split = blockIdx.y;
  const int64_t row = blockIdx.z;  // b * n_q + i
  const int num_heads = static_cast<int>(p.num_heads);
  const int head0 = static_cast<int>(blockIdx.x) * kHeads;
  const int group = threadIdx.x / 128;  // warpgroup
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const MlaSplit sp = mla_split(a, row, split);
  const bool sparse = sp.sparse;
  const int64_t begin = sp.begin, num_tiles = sp.num_tiles;
  const DsaCache& cache = p.cache;

  // Thread tid handles key tid / 4 of every tile (kThreadsPerKey above): a warp's loads
  // take 64 contiguous bytes of each of 8 latents, and its fp16 stores land on 8 rows of
  // different swizzle phases, so they take the 4 shared-memory wavefronts that 512 bytes
  // need. The key's slot id (sparse) or block id (dense), -1 past the split's end, is
  // fetched a tile before its codes are requested, the codes a tile before they are used.
  const int my_key = static_cast<int>(threadIdx.x) / kThreadsPerKey;
  const int quarter = static_cast<int>(threadIdx.x) % kThreadsPerKey;
  auto fetch_id = [&](int64_t k) {
    const int64_t e = begin + k * kKeys + my_key;
    if (e >= sp.end) return int32_t{-1};
    return sparse ? sp.list[e] : sp.table[e >> sp.bs_shift];
  };
  auto load_codes = [&](int64_t k, int32_t id, uint4(&codes)[kDimBlocks]) {
#pragma unroll
    for (int j = 0; j < kDimBlocks; ++j) codes[j] = make_uint4(0u, 0u, 0u, 0u);
    if (id < 0) return;
    const int64_t block = sparse ? int64_t{id >> sp.bs_shift} : int64_t{id};
    const int64_t in_block =
        sparse ? int64_t{id & sp.bs_mask} : (begin + k * kKeys + my_key) & sp.bs_mask;
    const auto* src =
        reinterpret_cast<const uint4*>(cache.pool + block * cache.row_bytes + cache.latent_offset +
                                       in_block * kDsaLatentDim + quarter * 16);
#pragma unroll
    for (int j = 0; j < kDimBlocks; ++j) codes[j] = __ldg(src + 4 * j);
  };
  // The codes -> fp16 (exact) into k, and the key's valid flag.
  auto store_codes = [&](const uint4(&codes)[kDimBlocks], bool valid) {
#pragma unroll
    for (int j = 0; j < kDimBlocks; ++j) {
      const uint32_t w[4] = {codes[j].x, codes[j].y, codes[j].z, codes[j].w};
      uint32_t h[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        h[2 * e] = e4m3x2_to_f16x2(w[e] & 0xffffu);
        h[2 * e + 1] = e4m3x2_to_f16x2(w[e] >> 16);
      }
      uint8_t* dst = k_s + j * kPanelBytes;
      *reinterpret_cast<uint4*>(dst + sw128_offset(my_key, 32 * quarter)) =
          make_uint4(h[0], h[1], h[2], h[3]);
      *reinterpret_cast<uint4*>(dst + sw128_offset(my_key, 32 * quarter + 16)) =
          make_uint4(h[4], h[5], h[6], h[7]);
    }
    if (quarter == 0) valid_s[my_key] = valid ? 1 : 0;
  };

  // q rows: warp w (of 8) converts rows w + 8r, all of its rows' float4s requested first
  // (5 per lane: 128 of q_lat, 16 of q_pe per row); tile 0's ids and codes are requested
  // before the conversion, tile 1's ids after.
  constexpr int kRowsPerWarp = kHeads / (kThreads / 32);  // 8
  constexpr int kVecsPerRow = kDsaLatentDim / 4;          // 144
  constexpr int kVecsPerLane = (kVecsPerRow + 31) / 32;   // 5
  const int warp_all = threadIdx.x / 32;
  float4 v[kRowsPerWarp][kVecsPerLane];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp_all + (kThreads / 32) * j;
    // Heads past num_heads (a last group of fewer than 64) are zero rows: their logits
    // are 0 and their outputs are not written.
    const bool head_ok = head0 + r < num_heads;
    const int64_t qh = row * num_heads + (head_ok ? head0 + r : 0);
    const auto* q_lat = reinterpret_cast<const float4*>(p.q_lat + qh * kDsaLoraDim);
    const auto* q_pe = reinterpret_cast<const float4*>(p.q_pe + qh * kDsaRopeDim);
#pragma unroll
    for (int k = 0; k < kVecsPerLane; ++k) {
      const int e = k * 32 + lane;
      v[j][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (head_ok && e < kVecsPerRow) {
        v[j][k] = e < kDsaLoraDim / 4 ? q_lat[e] : q_pe[e - kDsaLoraDim / 4];
      }
    }
  }
  int32_t id = -1;
  uint4 codes[kDimBlocks];
  bool valid = false;
  if (num_tiles > 0) {
    id = fetch_id(0);
    load_codes(0, id, codes);
    valid = id >= 0;
    id = fetch_id(1);
  }
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp_all + (kThreads / 32) * j;
    float inv = 0.0f;
    const float scale = mla_q_scale(v[j], inv);
#pragma unroll
    for (int k = 0; k < kVecsPerLane; ++k) {
      const int e = k * 32 + lane;  // dims 4e ..+4: block e / 16, byte 8 (e % 16)
      if (e < kVecsPerRow) {
        *reinterpret_cast<uint2*>(q_s + (e / 16) * kPanelBytes + sw128_offset(r, 8 * (e % 16))) =
            mla_q_f16x4(v[j][k], inv);
      }
    }
    if (lane == 0) factor_s[r] = scale * cache.latent_scale * p.softmax_scale * kLog2e;
  }
  fence_proxy_async();

  // Rows of this thread's accumulators: r0 = 16 warp + g (d[4n], d[4n + 1]) and r0 + 8
  // (d[4n + 2], d[4n + 3]); QK columns are keys 32 group + 8n + 2t (+1), PV columns dims
  // 256 group + 8n + 2t (+1).
  const int r0 = 16 * warp + g;
  const int r1 = r0 + 8;
  float o[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) o[e] = 0.0f;
  float run_max0 = -INFINITY, run_max1 = -INFINITY;
  float run_sum0 = 0.0f, run_sum1 = 0.0f;  // this thread's columns only

  for (int64_t k = 0; k < num_tiles; ++k) {
    __syncthreads();  // k and p are free: both warpgroups' PV of the last tile completed
    store_codes(codes, valid);
    // The fence waits for every load of the thread in flight (it is a memory barrier), so
    // it comes before the next tile's loads, not after them: those then have QK and the
    // softmax to land before the fence on p. (Measured within 2%: sparse B = 64 x 128K
    // 83.5 -> 82.5 us, B = 32 x 1M 52.0 -> 50.6; staging the codes two tiles ahead by
    // cp.async instead of registers gained nothing, 83.7 -> 84.5.)
    fence_proxy_async();
    if (k + 1 < num_tiles) {
      load_codes(k + 1, id, codes);
      valid = id >= 0;
    }
    id = fetch_id(k + 2);
    __syncthreads();  // k written

    // QK over 36 k-steps of 16 dims: block s / 4, bytes 32 (s % 4) of every row.
    float s[16];
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < kDsaLatentDim / 16; ++st) {
      const int off = (st / 4) * kPanelBytes + (st % 4) * 32;
      wgmma_f16_n32_kmajor(s, wgmma_desc_sw128(q_s + off),
                           wgmma_desc_sw128(k_s + off + group * 32 * 128), st);
    }
    wgmma_commit();
    wgmma_wait<0>(s);

    // Softmax: logits in base 2, masked keys -inf; the tile's row maxima of both halves.
    const float f0 = factor_s[r0], f1 = factor_s[r1];
    float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int key = 32 * group + 8 * n + 2 * t;
      const bool v0 = valid_s[key] != 0, v1 = valid_s[key + 1] != 0;
      s[4 * n] = v0 ? s[4 * n] * f0 : -INFINITY;
      s[4 * n + 1] = v1 ? s[4 * n + 1] * f0 : -INFINITY;
      s[4 * n + 2] = v0 ? s[4 * n + 2] * f1 : -INFINITY;
      s[4 * n + 3] = v1 ? s[4 * n + 3] * f1 : -INFINITY;
      m0 = fmaxf(m0, fmaxf(s[4 * n], s[4 * n + 1]));
      m1 = fmaxf(m1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    if (t == 0) {
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
      const int key = 32 * group + 8 * n + 2 * t;
      const __half2 p0 =
          new0 == -INFINITY ? __floats2half2_rn(0.0f, 0.0f)
                            : __floats2half2_rn(exp2f(s[4 * n] - new0), exp2f(s[4 * n + 1] - new0));
      const __half2 p1 = new1 == -INFINITY ? __floats2half2_rn(0.0f, 0.0f)
                                           : __floats2half2_rn(exp2f(s[4 * n + 2] - new1),
                                                               exp2f(s[4 * n + 3] - new1));
      sum0 += __low2float(p0) + __high2float(p0);
      sum1 += __low2float(p1) + __high2float(p1);
      *reinterpret_cast<__half2*>(p_s + sw128_offset(r0, 2 * key)) = p0;
      *reinterpret_cast<__half2*>(p_s + sw128_offset(r1, 2 * key)) = p1;
    }
    run_sum0 = run_sum0 * corr0 + sum0;
    run_sum1 = run_sum1 * corr1 + sum1;
    run_max0 = new0;
    run_max1 = new1;
    // Once the running maxima settle the factors are 1: skipping the products changes
    // no bit.
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

    // PV over 4 k-steps of 16 keys: A bytes 32 ks of every p row; B rows 16 ks ..+16 of
    // k (2,048 bytes per step), this warpgroup's 4 column blocks kPanelBytes apart.
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      wgmma_f16_n256_nmajor(
          o, wgmma_desc_sw128(p_s + 32 * ks),
          wgmma_desc_sw128_mn(k_s + 4 * group * kPanelBytes + ks * 2048, kPanelBytes), 1);
    }
    wgmma_commit();
    wgmma_wait<0>(o);
  }

  // Partials: the row sums over the 4 lanes of a row and both warpgroups; o straight from
  // the accumulators (a warp store covers 8 rows x 32 contiguous bytes: whole sectors).
  run_sum0 += __shfl_xor_sync(0xffffffffu, run_sum0, 1);
  run_sum0 += __shfl_xor_sync(0xffffffffu, run_sum0, 2);
  run_sum1 += __shfl_xor_sync(0xffffffffu, run_sum1, 1);
  run_sum1 += __shfl_xor_sync(0xffffffffu, run_sum1, 2);
  if (t == 0) {
    sum_s[group * kHeads + r0] = run_sum0;
    sum_s[group * kHeads + r1] = run_sum1;
  }
  __syncthreads();
  const int64_t num_splits = a.num_splits;
  const bool ok0 = head0 + r0 < num_heads, ok1 = head0 + r1 < num_heads;
  const int64_t qh0 = (row * num_heads + head0 + r0) * num_splits + split;
  const int64_t qh1 = (row * num_heads + head0 + r1) * num_splits + split;
  if (group == 0 && t == 0) {
    if (ok0) a.part_ml[qh0] = make_float2(run_max0, sum_s[r0] + sum_s[kHeads + r0]);
    if (ok1) a.part_ml[qh1] = make_float2(run_max1, sum_s[r1] + sum_s[kHeads + r1]);
  }
  float* out0 = a.part_o + qh0 * kDsaLoraDim + 256 * group + 2 * t;
  float* out1 = a.part_o + qh1 * kDsaLoraDim + 256 * group + 2 * t;
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    if (ok0) *reinterpret_cast<float2*>(out0 + 8 * n) = make_float2(o[4 * n], o[4 * n + 1]);
    if (ok1) *reinterpret_cast<float2*>(out1 + 8 * n) = make_float2(o[4 * n + 2], o[4 * n + 3]);
  }
}

}  // namespace

size_t mla_wgmma_shared_bytes() {
  return Smem::kAllocated;
}

void launch_mla_wgmma(const MlaArgs& a, dim3 grid, cudaStream_t stream) {
  CUDA_CHECK(cudaFuncSetAttribute(mla_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Smem::kAllocated));
  mla_wgmma_kernel<<<grid, kThreads, Smem::kAllocated, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda::dsa
