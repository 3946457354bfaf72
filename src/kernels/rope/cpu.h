// CPU reference of the RoPE rotations (params.h). Pair i is rotated by
//   angle = float(pos) * inv_freq[i],  c = cos(angle) * af,  s = sin(angle) * af:
//   (a, b) -> (a c - b s, b c + a s)
// interleaved: pair i is dims (2i, 2i+1)            (DeepSeek's MLA q_pe / k_pe)
// neox:        pair i is dims (i, i + rotary_dim/2) (DeepSeek-V3.2's indexer)
#pragma once

#include "kernels/rope/params.h"

namespace hyserve::cpu {

void apply_rope_interleaved(const RopeTable& table, const RopeParams& p);
void apply_rope_neox(const RopeTable& table, const RopeParams& p);
// The backend op: p.rope rotated with p.table's angles in p's pairing.
inline void rope(const RopeOpParams& p) {
  if (p.neox) {
    apply_rope_neox(*p.table, p.rope);
  } else {
    apply_rope_interleaved(*p.table, p.rope);
  }
}

}  // namespace hyserve::cpu
