// The op table: every op of MODEL.md a backend runs, declared once with its Params struct
// (src/kernels/<family>/params.h). From this one list follow
//   - the Backend interface (backend.h): virtual void name(const Params& p) = 0;
//   - the CPU dispatch (cpu_backend.cpp): cpu::name(p) (kernels/<family>/cpu.h);
//   - the CUDA dispatch (cuda/cuda_backend.cpp): by the third column,
//       STREAM  cuda::name(p, stream) on the backend's stream (kernels/<family>/cuda.h);
//       OWN     written in cuda_backend.cpp: the op takes the backend's scratch memory,
//               cuBLAS handle, per-weight device tables or batch-invariant choice;
//   - the timing decorator (bench/timing_backend.*): each op bracketed by CUDA events, with
//     the bytes and FLOPs its op_cost overload counts (ops without one run untimed).
// Adding an op: its Params in params.h, cpu::name in cpu.h/cpu.cpp, cuda::name in the CUDA
// family, and one line here (docs/ARCHITECTURE.md "Adding an op").
#pragma once

// X(name, Params, cuda)
#define HYSERVE_BACKEND_OPS(X)                                            \
  /* Linears, norms, embeddings (linear/, norm/, mlp/) */                 \
  X(linear, LinearParams, OWN)                                            \
  X(linears, LinearsParams, OWN)                                          \
  X(embedding_lookup, EmbeddingParams, STREAM)                            \
  X(rms_norm, RmsNormParams, STREAM)                                      \
  X(layer_norm, LayerNormParams, STREAM)                                  \
  X(attn_res_norm, AttnResNormParams, STREAM)                             \
  X(mlp, MlpParams, OWN)                                                  \
  X(lora_add, LoraParams, OWN)                                            \
  /* MoE (moe/) */                                                        \
  X(route_experts, RouterParams, OWN)                                     \
  X(moe, MoeParams, OWN)                                                  \
  /* Attention: RoPE, MLA, the DSA indexer (rope/, mla/, indexer/) */     \
  X(rope, RopeOpParams, OWN)                                              \
  X(mla_attention, MlaAttentionOpParams, OWN)                             \
  X(hadamard_rotate, HadamardParams, STREAM)                              \
  X(quantize_fp8_ue8m0, QuantizeFp8Ue8m0Params, STREAM)                   \
  X(indexer_scores, IndexerScoreParams, STREAM)                           \
  X(indexer_scores_fp8_cache, IndexerFp8CacheScoreParams, STREAM)         \
  X(causal_topk, CausalTopkParams, STREAM)                                \
  /* KDA (kda/) */                                                        \
  X(short_conv_silu, ShortConvParams, STREAM)                             \
  X(kda_gate, KdaGateParams, STREAM)                                      \
  X(l2norm_rows, L2NormRowsParams, STREAM)                                \
  X(kda_recurrent, KdaParams, STREAM)                                     \
  X(kda_chunked, KdaParams, OWN)                                          \
  X(gated_rms_norm, GatedRmsNormParams, STREAM)                           \
  X(kda_decode, KdaDecodeParams, STREAM)                                  \
  /* Elementwise over n floats, strided copies (elementwise/) */          \
  X(residual_add, ResidualAddParams, STREAM)                              \
  X(sigmoid_gate, SigmoidGateParams, STREAM)                              \
  X(sigmoid, SigmoidParams, STREAM)                                       \
  X(scale, ScaleParams, STREAM)                                           \
  X(mul, MulParams, STREAM)                                               \
  X(copy_2d, Copy2dParams, OWN)                                           \
  /* The paged cache's rows (cache/) */                                   \
  X(scatter_rows, ScatterRowsParams, STREAM)                              \
  X(gather_rows, GatherRowsParams, STREAM)                                \
  /* Decode context parallelism (elementwise/, attention_merge/), the */  \
  /* DSA indexer's exact top-k merge between all_gathers (topk_merge/) */ \
  X(dcp_localize, DcpLocalizeParams, STREAM)                              \
  X(attention_merge, AttentionMergeParams, STREAM)                        \
  X(topk_merge_pack, TopkMergeParams, STREAM)                             \
  X(topk_merge_decide, TopkMergeParams, STREAM)                           \
  X(topk_merge_resend_pack, TopkMergeParams, STREAM)                      \
  X(topk_merge_resend_decide, TopkMergeParams, STREAM)                    \
  /* The FP8 latent cache and DSA decode (latent/, dsa/) */               \
  X(quantize_e4m3, QuantizeE4m3Params, STREAM)                            \
  X(round_bf16, RoundBf16Params, STREAM)                                  \
  X(mla_absorb_q, MlaAbsorbParams, STREAM)                                \
  X(mla_project_uv, MlaProjectParams, STREAM)                             \
  X(dsa_query_slots, DsaQuerySlotsParams, STREAM)                         \
  X(dsa_mla_decode, DsaMlaParams, OWN)                                    \
  X(dsa_decode, DsaDecodeParams, OWN)                                     \
  /* Logits processing and sampling (logits/, sampling/) */               \
  X(apply_penalties, PenaltyParams, STREAM)                               \
  X(count_tokens, CountTokensParams, STREAM)                              \
  X(adjust_logits, LogitAdjustParams, STREAM)                             \
  X(apply_token_mask, TokenMaskParams, STREAM)                            \
  X(token_logprobs, LogprobParams, STREAM)                                \
  X(sample_tokens, SampleParams, STREAM)                                  \
  X(gather_tokens, GatherTokensParams, STREAM)
