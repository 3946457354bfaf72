// CPU reference of token sampling (params.h defines the rule exactly): a sort of the
// row by rank, the filters as prefix cuts, then the draw in id order.
#pragma once

#include "kernels/sampling/params.h"

namespace hyserve::cpu {

// Throws on invalid options (params.h ranges) or shapes. A row whose logits are all
// NaN gets token -1.
void sample_tokens(const SampleParams& p);
void gather_tokens(const GatherTokensParams& p);

}  // namespace hyserve::cpu
