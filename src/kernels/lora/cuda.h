// CUDA LoRA add (params.h): y[t] += scale * (x[t] A^T) B^T for the tokens whose slot's
// adapter has matrices on this projection, the shrink (x A^T into the rank-r vector u) and
// the expand (u B^T) of Punica's pair in one launch, one block per token. Device memory
// throughout: x, y, token_slots, the module's slot table (LoraModule::slots, LoraMatrices
// of device pointers: model/lora_table.h keeps them on the device) and A, B (fp32).
//
// Numerics: fp32 with a fixed order per token (each of the rank dot products over `in`
// split over one warp's lanes, lane-strided, then a butterfly sum; each output's sum over
// rank in order), so a token's bits never depend on its batch (--batch-invariant) and
// differ from the CPU reference's sequential sums only by the summation order:
// |error| <= ~in * 2^-24 * sum |x a| per rank entry (tested at abs 1e-5, rel 1e-4).
// A token of slot -1, of a slot without matrices, or of a slot out of range is left
// untouched; a rank over kMaxLoraRank (params.h) is refused by the host side (LoraTable).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/lora/params.h"

namespace hyserve::cuda {

void lora_add(const LoraParams& p, cudaStream_t stream);

}  // namespace hyserve::cuda
