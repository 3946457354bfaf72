// Device steps both tensor-core scorers take (indexer_scores_mma.cu, indexer_scores_wgmma.cu):
// the CTA's key range cut at its queries' last visible key, and a q row quantized as
// cpu::quantize_fp8_ue8m0 does.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/indexer/cuda/fp8_quant.cuh"
#include "kernels/attention/indexer/cuda/indexer_scores_mma.h"

namespace hyserve::cuda::indexer {

// The steps of `step` keys from `begin` (a CTA's range [begin, end)) up to the largest key
// its num_queries queries from query0 see; the keys of [begin, end) past those steps are
// written -inf for every query by the whole block.
template <int kThreads>
__device__ __forceinline__ int visible_steps(const TensorScoreArgs& a, int64_t query0,
                                             int num_queries, int64_t begin, int64_t end,
                                             int step) {
  int64_t last = -1;
  for (int i = 0; i < num_queries; ++i) last = max(last, min(a.q_pos[query0 + i], a.num_keys - 1));
  const int64_t compute_end = min(end, last + 1);
  const int steps =
      compute_end > begin ? static_cast<int>((compute_end - begin + step - 1) / step) : 0;
  const int64_t fill_begin = min(end, begin + int64_t{steps} * step);
  const int64_t fill_len = end - fill_begin;
  for (int64_t i = threadIdx.x; i < num_queries * fill_len; i += kThreads) {
    a.scores[(query0 + i / fill_len) * a.num_keys + fill_begin + i % fill_len] = -INFINITY;
  }
  return steps;
}

// Row q_row of q viewed [T * Hi, 128], by a warp (lane: dims [4 lane, +4)): its e4m3 codes of
// those dims and w' = the row's head weight times its ue8m0 scale.
__device__ __forceinline__ uint32_t quantize_q_row(const TensorScoreArgs& a, int64_t q_row,
                                                   int lane, float& w) {
  const float4 x = reinterpret_cast<const float4*>(a.q + q_row * 128)[lane];
  float amax = max_like_std(0.0f, fabsf(x.x));
  amax = max_like_std(amax, fabsf(x.y));
  amax = max_like_std(amax, fabsf(x.z));
  amax = max_like_std(amax, fabsf(x.w));
  const float scale = ue8m0_scale(warp_max(amax));
  w = a.head_weights[q_row] * scale;
  return quantize4(x, scale);
}

}  // namespace hyserve::cuda::indexer
