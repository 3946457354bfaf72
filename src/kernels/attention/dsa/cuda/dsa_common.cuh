// Small device helpers shared by the DSA decode kernels: the CUDA-only limits of the
// Params (after validate, check.h), workspace alignment, and the warp-level MMA wrappers (PTX,
// sm_89+).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/cuda/cp_async.cuh"
#include "kernels/attention/dsa/check.h"
#include "kernels/attention/dsa/params.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda::dsa {

constexpr size_t kAlign = 256;

inline size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The CUDA-only limits of the cache and the batch, checked after validate (check.h): the
// pool is read with aligned vector loads and cp.async; the kernels' tiles take block sizes
// of 32..2^20 and run slot ids and positions in int32; the grids hold the requests.
inline void check_cuda_limits(const DsaCache& c, const char* op) {
  CHECK(reinterpret_cast<uintptr_t>(c.pool) % 256 == 0, op,
        ": cache pool must be 256-byte aligned");
  CHECK(c.block_size >= 32 && c.block_size <= (1 << 20), op,
        ": cache block_size must be a power of two in 32..2^20, got ", c.block_size);
  CHECK(c.num_blocks * c.block_size < (int64_t{1} << 31), op,
        ": slot ids must fit int32: ", c.num_blocks, " blocks of ", c.block_size);
}

inline void check_cuda_limits(const DsaBatch& b, const char* op) {
  CHECK(b.num_requests < 65536, op, ": num_requests ", b.num_requests);
  CHECK(b.max_context < (int64_t{1} << 31), op, ": max_context ", b.max_context);
}

// d += a * b, m16n8k16, f16 x f16 -> f32.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Word w (0..3) of a uint4; w is a constant after unrolling.
__device__ __forceinline__ uint32_t word4(const uint4& v, int w) {
  switch (w) {
    case 0:
      return v.x;
    case 1:
      return v.y;
    case 2:
      return v.z;
    default:
      return v.w;
  }
}

// Two e4m3 codes (low byte -> low half) to f16x2, exactly (cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes16) {
  uint32_t out;
  const uint16_t in = static_cast<uint16_t>(codes16);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(in));
  return out;
}

// cp.async helpers (core/cuda/cp_async.cuh), with the L2-policy forms below.
using cuda::cp_async_16;
using cuda::cp_async_commit;
using cuda::cp_async_wait;

// L2 eviction priorities (createpolicy, sm_80+). A DSA step streams ~30x more index-key
// bytes than it writes scores, and the top-k reads the scores back right after. Where the
// step's scores fit L2 (keep_scores_in_l2) the indexer marks its key copies evict-first
// and its score stores evict-last, and the top-k's first pass loads them evict-last
// (its last pass evict-first). Measured on the H200 (2026-12-01, steps, hints / none):
// B = 1 x 1M 83.4 / 90.7 us, B = 8 x 128K 96.4 / 101.9, B = 32 x 128K 243.9 / 247.6,
// B = 8 x 512K 213.7 / 217.5, B = 8 x 1M 363.8 / 365.0; the keys alone marked evict-first
// at B = 64 x 1M (256 MiB of scores): 2,541 / 2,507, so larger steps take no hints.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_normal() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// Whether a step with score_bytes of scores takes the hints above: at most 3/4 of L2
// (B = 8 x 1M: 32 MiB of the H200's 50 MiB).
bool keep_scores_in_l2(size_t score_bytes);
// cp_async_16 with an L2 policy.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes,
                                            uint64_t policy) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s),
               "l"(gmem), "r"(src_bytes), "l"(policy));
}
// A float store and a read-only float4 load with an L2 policy.
__device__ __forceinline__ void store_f32(float* gmem, float v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;\n" ::"l"(gmem), "f"(v), "l"(policy)
               : "memory");
}
__device__ __forceinline__ float4 load_f4(const float4* gmem, uint64_t policy) {
  float4 v;
  asm("ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(gmem), "l"(policy));
  return v;
}
// 4-byte async copy global -> shared (through L1: the .cg form takes 16 bytes only);
// src_bytes 0 fills zeros without reading.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes = 4) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_bytes));
}

// Programmatic dependent launch: the kernels of a DSA step are launched so that the next
// one's blocks may become resident while the previous one finishes (its launch latency
// and block start-up overlap the tail of the previous grid). Each such kernel calls
// follow_previous_grid() first thing, before it reads anything: the wait returns when the
// previous grid has completed and its memory is visible (and so, transitively, every
// earlier one), so the stream's order holds for all data. Both parts are no-ops when the
// kernel was launched plainly.
__device__ __forceinline__ void start_next_grid() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void wait_previous_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Both, in that order: the kernel after this one may start, this one waits for the last.
__device__ __forceinline__ void follow_previous_grid() {
  start_next_grid();
  wait_previous_grid();
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream
// serialization (the kernel must begin with follow_previous_grid).
// Captured into CUDA graphs as a programmatic edge.
template <class... Params, class... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The top-k for a caller that zeroes the start of its workspace itself (dsa_decode: one
// memset before the indexer). The workspace's first topk_zero_bytes(p) bytes must be zero
// when the top-k's kernels start; its first rows x 2048 ints may serve as p.histogram
// (the indexer's histogram, built into the zeroed bytes). after_kernel: the stream's last
// operation is a kernel (the indexer), with which the top-k's first kernel is then
// launched overlapped.
size_t topk_zero_bytes(const DsaTopkParams& p);
void topk_prezeroed(const DsaTopkParams& p, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream, bool after_kernel);

}  // namespace hyserve::cuda::dsa
