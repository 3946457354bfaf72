// CPU reference of MLA attention (params.h). Both forms walk each query's keys in
// ascending position order with the same softmax, so the dense path and a top-k list
// holding every visible key give bitwise-equal results within one form.
#pragma once

#include "kernels/attention/mla/params.h"

namespace hyserve::cpu {

// Per head: K_nope = c W_UK^T, V = c W_UV^T;
// logit = (q_nope.k_nope + q_pe.k_pe) * scale; o = softmax(logit) @ V.
void mla_attention_expanded(const MlaAttentionParams& p);

// Per head: q_lat = q_nope W_UK; logit = (q_lat.c + q_pe.k_pe) * scale;
// o_lat = softmax(logit) @ c; o = W_UV o_lat.
void mla_attention_absorbed(const MlaAttentionParams& p);

// The backend op: p.attn in the form p.absorbed names.
inline void mla_attention(const MlaAttentionOpParams& p) {
  if (p.absorbed) {
    mla_attention_absorbed(p.attn);
  } else {
    mla_attention_expanded(p.attn);
  }
}

}  // namespace hyserve::cpu
