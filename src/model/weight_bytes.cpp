#include "model/weight_bytes.h"

#include "util/error.h"

namespace hyserve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

enum class Storage { kBf16, kFp8Block, kMxfp4, kInt4 };

// Bytes of a [rows, cols] matrix (cols = input dim, along which MXFP4 / INT4 groups run).
int64_t matrix_bytes(int64_t rows, int64_t cols, Storage s) {
  switch (s) {
    case Storage::kBf16:
      return 2 * rows * cols;
    case Storage::kFp8Block:
      return rows * cols + 4 * ceil_div(rows, 128) * ceil_div(cols, 128);
    case Storage::kMxfp4:
      return rows * cols / 2 + rows * ceil_div(cols, 32);
    case Storage::kInt4:  // bf16 scales, as Kimi K2 Thinking ships them
      return rows * cols / 2 + 2 * rows * ceil_div(cols, 32);
  }
  return 0;
}

}  // namespace

WeightBytes estimate_weight_bytes_per_gpu(const ModelConfig& c, int64_t tp) {
  CHECK(tp >= 1, "tp must be >= 1, got ", tp);
  const int64_t d = c.hidden_size;
  const Storage linear = c.fp8_block_weights ? Storage::kFp8Block : Storage::kBf16;
  const Storage bf16 = Storage::kBf16;
  const Storage experts = c.expert_format == ExpertFormat::kInt4       ? Storage::kInt4
                          : c.expert_format == ExpertFormat::kMxfp4    ? Storage::kMxfp4
                          : c.expert_format == ExpertFormat::kFp8Block ? Storage::kFp8Block
                                                                       : Storage::kBf16;
  auto split = [tp](int64_t n, const char* what) {
    CHECK(n % tp == 0, "tp (", tp, ") must divide ", what, " (", n, ")");
    return n / tp;
  };
  WeightBytes w;
  const int64_t vocab_shard = ceil_div(c.vocab_size, tp);
  w.sharded += matrix_bytes(vocab_shard, d, bf16) * (c.tie_word_embeddings ? 1 : 2);
  w.replicated += 2 * d;                                                            // model.norm
  if (c.has_attn_res()) w.replicated += 2 * 2 * d * (2 * c.num_hidden_layers + 1);  // AttnRes

  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    w.replicated += 2 * 2 * d;  // input_layernorm, post_attention_layernorm
    if (c.is_kda(layer)) {
      const int64_t k = c.linear_head_dim;
      const int64_t heads = split(c.linear_num_heads, "linear_num_heads");
      const int64_t width = heads * k;
      w.sharded += 3 * matrix_bytes(width, d, linear)      // q, k, v proj
                   + 4 * 3 * width * c.linear_conv_kernel  // q, k, v conv1d (fp32)
                   + matrix_bytes(width, k, linear)        // f_b
                   + matrix_bytes(heads, d, linear)        // b_proj
                   + 4 * (heads + width)                   // A_log, dt_bias (fp32)
                   + matrix_bytes(d, width, linear);       // o_proj
      w.replicated += matrix_bytes(k, d, linear) + 4 * k;  // f_a, o_norm (fp32)
      if (c.kda_full_rank_gate) {
        w.sharded += matrix_bytes(width, d, linear);  // g_proj
      } else {
        w.sharded += matrix_bytes(width, k, linear);  // g_b
        w.replicated += matrix_bytes(k, d, linear);   // g_a
      }
    } else {
      const int64_t heads = split(c.num_attention_heads, "num_attention_heads");
      const int64_t q_out = heads * c.qk_head_dim();
      if (c.q_lora_rank > 0) {
        w.replicated += matrix_bytes(c.q_lora_rank, d, linear) + 2 * c.q_lora_rank;
        w.sharded += matrix_bytes(q_out, c.q_lora_rank, linear);
      } else {
        w.sharded += matrix_bytes(q_out, d, linear);
      }
      w.replicated += matrix_bytes(c.kv_lora_rank + c.qk_rope_head_dim, d, linear) +
                      2 * c.kv_lora_rank;  // kv_a_proj_with_mqa, kv_a_layernorm
      w.sharded += matrix_bytes(heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
                                linear)                              // kv_b_proj
                   + matrix_bytes(d, heads * c.v_head_dim, linear);  // o_proj
      if (c.mla_output_gate) w.sharded += matrix_bytes(heads * c.v_head_dim, d, linear);
      if (c.has_indexer()) {
        const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : d;
        w.replicated += matrix_bytes(c.index_n_heads * c.index_head_dim, q_in, linear)  // wq_b
                        + matrix_bytes(c.index_head_dim, d, linear)                     // wk
                        + 2 * 2 * c.index_head_dim                                      // k_norm
                        + matrix_bytes(c.index_n_heads, d, bf16);  // weights_proj
      }
    }
    if (c.is_moe(layer)) {
      const int64_t inter = split(c.moe_intermediate_size, "moe_intermediate_size");
      const int64_t de = c.expert_hidden_size();
      const int64_t expert_linear =
          2 * matrix_bytes(inter, d, linear) + matrix_bytes(d, inter, linear);
      const int64_t expert_routed =
          2 * matrix_bytes(inter, de, experts) + matrix_bytes(de, inter, experts);
      w.replicated += matrix_bytes(c.num_experts, d, bf16) + 4 * c.num_experts;  // router, bias
      w.sharded += c.num_shared_experts * expert_linear;
      if (c.moe_latent_size > 0)  // routed_expert_{down,up}_proj, routed_expert_norm
        w.replicated += 2 * matrix_bytes(de, d, bf16) + (c.moe_latent_norm ? 2 * de : 0);
      w.routed_experts += c.num_experts * expert_routed;
    } else {
      const int64_t inter = split(c.intermediate_size, "intermediate_size");
      w.sharded += 2 * matrix_bytes(inter, d, linear) + matrix_bytes(d, inter, linear);
    }
  }
  return w;
}

}  // namespace hyserve
