// CUDA FP8-latent helper ops (params.h); pointers are DEVICE pointers (kv_b->data and
// kv_b->scales too; the Weight struct is read on the host). Nothing allocates; every op
// reads its sizes from the Params only, so a decode step stays capturable in a graph.
//
//   quantize_e4m3    bitwise equal to cpu::quantize_e4m3 (the same rounding steps)
//   round_bf16       bitwise equal to cpu::round_bf16 (the same integer steps)
//   mla_absorb_q     a block per (8 tokens, head): a thread per latent column sums over
//   mla_project_uv   d / a warp per output column sums over l; fp32, equal to the CPU up to
//                    summation order (and fused multiply-adds)
//   dsa_query_slots  a thread per entry; positions are trusted (not checked on the device)
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/latent/params.h"

namespace hyserve::cuda {

void quantize_e4m3(const QuantizeE4m3Params& p, cudaStream_t stream);
void round_bf16(const RoundBf16Params& p, cudaStream_t stream);
void mla_absorb_q(const MlaAbsorbParams& p, cudaStream_t stream);
void mla_project_uv(const MlaProjectParams& p, cudaStream_t stream);
void dsa_query_slots(const DsaQuerySlotsParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
