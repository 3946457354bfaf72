// CPU reference of the FP8-latent helper ops (params.h): fp32, one loop nest per op.
#pragma once

#include "kernels/attention/latent/params.h"

namespace hyserve::cpu {

void quantize_e4m3(const QuantizeE4m3Params& p);
void round_bf16(const RoundBf16Params& p);
// Sums run over d (absorb) and l (project) in ascending order.
void mla_absorb_q(const MlaAbsorbParams& p);
void mla_project_uv(const MlaProjectParams& p);
// Throws on a position outside the query's visible keys 0..q_pos[t].
void dsa_query_slots(const DsaQuerySlotsParams& p);

}  // namespace hyserve::cpu
