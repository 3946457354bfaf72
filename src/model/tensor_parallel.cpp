#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "util/error.h"

namespace hyserve {
namespace {

// Divides one config field by tp, naming it when it does not divide.
void divide(int64_t& field, const char* name, int tp) {
  if (field % tp != 0) {
    HYSERVE_THROW(ConfigError, name, " = ", field, " is not divisible by the tensor-parallel size ",
                  tp);
  }
  field /= tp;
}

// Bytes of one element of data (quantized formats: two values per byte are handled by
// the callers).
int64_t scale_elem_bytes(const Weight& w) {
  return w.format == WeightFormat::kDense ? 0 : dtype_size(w.scales_dtype);
}

// Columns of a row one scale covers (the block or group width), 1 for dense.
int64_t scale_group(const Weight& w) {
  switch (w.format) {
    case WeightFormat::kFp8Block:
      return Weight::kFp8BlockSize;
    case WeightFormat::kMxfp4:
      return Weight::kMxfp4BlockSize;
    case WeightFormat::kInt4:
      return Weight::kInt4GroupSize;
    case WeightFormat::kDense:
      return 1;
  }
  return 1;
}

// Bytes of `n` consecutive values of a row.
int64_t value_bytes(const Weight& w, int64_t n) {
  switch (w.format) {
    case WeightFormat::kDense:
      return n * dtype_size(w.dtype);
    case WeightFormat::kFp8Block:
      return n;
    case WeightFormat::kMxfp4:
    case WeightFormat::kInt4:
      return n / 2;
  }
  return 0;
}

const char* format_name(const Weight& w) {
  switch (w.format) {
    case WeightFormat::kDense:
      return "dense";
    case WeightFormat::kFp8Block:
      return "FP8 (128x128 blocks)";
    case WeightFormat::kMxfp4:
      return "MXFP4 (groups of 32)";
    case WeightFormat::kInt4:
      return "INT4 (groups of 32)";
  }
  return "?";
}

// Shares of n rows each (the last may be shorter) of a FP8 matrix must keep whole 128-row
// scale blocks. Decided from n alone, so that every rank of the group refuses alike.
void check_fp8_rows(const Weight& w, int64_t n, const std::string& what) {
  if (w.format == WeightFormat::kFp8Block && n % Weight::kFp8BlockSize != 0) {
    HYSERVE_THROW(CheckpointError, what, ": ", format_name(w), " rows split into ", n,
                  " per rank, not a multiple of ", Weight::kFp8BlockSize);
  }
}

// Rows [r0, r0 + n) of w: a view (FP8: r0 a multiple of 128).
Weight row_range(const Weight& w, int64_t r0, int64_t n) {
  Weight out = w;
  out.rows = n;
  const int64_t row_bytes = value_bytes(w, w.cols);
  out.data = static_cast<const uint8_t*>(w.data) + r0 * row_bytes;
  if (w.format == WeightFormat::kFp8Block) {
    const int64_t block = Weight::kFp8BlockSize;
    CHECK(r0 % block == 0, "FP8 rows from ", r0, " cut a scale block");
    const int64_t scale_cols = (w.cols + block - 1) / block;
    out.scales =
        static_cast<const uint8_t*>(w.scales) + (r0 / block) * scale_cols * scale_elem_bytes(w);
  } else if (w.format != WeightFormat::kDense) {
    out.scales = static_cast<const uint8_t*>(w.scales) +
                 r0 * (w.cols / scale_group(w)) * scale_elem_bytes(w);
  }
  return out;
}

}  // namespace

Weight row_shard(const Weight& w, int rank, int size, const std::string& what) {
  if (w.empty()) return w;
  if (w.rows % size != 0) {
    HYSERVE_THROW(CheckpointError, what, ": ", w.rows, " rows do not split over ", size,
                  " tensor-parallel ranks");
  }
  const int64_t n = w.rows / size;
  check_fp8_rows(w, n, what);
  return row_range(w, n * rank, n);
}

VocabShard vocab_shard(int64_t vocab_size, int rank, int size) {
  CHECK(size >= 1 && rank >= 0 && rank < size, "tensor-parallel rank ", rank, " of ", size);
  VocabShard v;
  v.stride = (vocab_size + size - 1) / size;
  v.first = std::min(vocab_size, v.stride * rank);
  v.rows = std::min(vocab_size, v.first + v.stride) - v.first;
  return v;
}

Weight vocab_rows(const Weight& w, const VocabShard& shard, const std::string& what) {
  if (w.empty()) return w;
  CHECK(shard.first >= 0 && shard.rows > 0 && shard.first + shard.rows <= w.rows, what,
        ": vocabulary rows [", shard.first, ", ", shard.first + shard.rows, ") of ", w.rows);
  if (shard.rows < w.rows) check_fp8_rows(w, shard.stride, what);
  return row_range(w, shard.first, shard.rows);
}

Weight col_shard(const Weight& w, int rank, int size, std::deque<std::vector<uint8_t>>& owned,
                 const std::string& what) {
  if (w.empty()) return w;
  if (w.cols % size != 0) {
    HYSERVE_THROW(CheckpointError, what, ": ", w.cols, " columns do not split over ", size,
                  " tensor-parallel ranks");
  }
  const int64_t n = w.cols / size;
  const int64_t c0 = n * rank;
  const int64_t group = scale_group(w);
  if (n % group != 0) {
    HYSERVE_THROW(CheckpointError, what, ": ", format_name(w), " columns split into ", n,
                  " per rank, not a multiple of ", group);
  }
  Weight out = w;
  out.cols = n;
  const int64_t src_row = value_bytes(w, w.cols);
  const int64_t dst_row = value_bytes(w, n);
  const int64_t skip = value_bytes(w, c0);
  std::vector<uint8_t>& data = owned.emplace_back(static_cast<size_t>(w.rows * dst_row));
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(data.data() + r * dst_row, src + r * src_row + skip, static_cast<size_t>(dst_row));
  }
  out.data = data.data();
  if (w.format != WeightFormat::kDense) {
    // Scales: [rows, cols / group] (FP8: [ceil(rows / 128), ceil(cols / 128)]).
    const int64_t scale_rows = w.format == WeightFormat::kFp8Block
                                   ? (w.rows + Weight::kFp8BlockSize - 1) / Weight::kFp8BlockSize
                                   : w.rows;
    const int64_t src_cols = (w.cols + group - 1) / group;
    const int64_t dst_cols = n / group;
    const int64_t eb = scale_elem_bytes(w);
    std::vector<uint8_t>& scales =
        owned.emplace_back(static_cast<size_t>(scale_rows * dst_cols * eb));
    const auto* s = static_cast<const uint8_t*>(w.scales);
    for (int64_t r = 0; r < scale_rows; ++r) {
      std::memcpy(scales.data() + r * dst_cols * eb, s + (r * src_cols + c0 / group) * eb,
                  static_cast<size_t>(dst_cols * eb));
    }
    out.scales = scales.data();
  }
  return out;
}

namespace {

struct Slicer {
  LoadedWeights& lw;
  int rank;
  int size;

  Weight rows(const Weight& w, const std::string& what) const {
    return row_shard(w, rank, size, what);
  }
  Weight cols(const Weight& w, const std::string& what) const {
    return col_shard(w, rank, size, lw.owned_bytes, what);
  }

  // Elements [rank * n * per, (rank + 1) * n * per) of v, n = units / size: a view.
  Vec part(const Vec& v, int64_t units, int64_t per, const std::string& what) const {
    if (v.empty()) return v;
    if (v.size != units * per || units % size != 0) {
      HYSERVE_THROW(CheckpointError, what, ": ", v.size, " values do not split into ", size,
                    " parts of whole heads");
    }
    const int64_t n = units / size * per;
    return Vec{v.data + n * rank, n};
  }

  void mlp(MlpWeights& m, const std::string& what) const {
    m.gate = rows(m.gate, what + ".gate_proj");
    m.up = rows(m.up, what + ".up_proj");
    m.down = cols(m.down, what + ".down_proj");
  }
};

}  // namespace

ExpertShard expert_shard(int64_t num_experts, int rank, int size) {
  CHECK(size >= 1 && rank >= 0 && rank < size && num_experts % size == 0, "expert shard of rank ",
        rank, " of ", size, " over ", num_experts, " experts");
  const int64_t count = num_experts / size;
  return {count * rank, count};
}

ModelConfig shard_config(const ModelConfig& full, int tp_size, bool expert_parallel) {
  CHECK(tp_size >= 1, "tensor-parallel size ", tp_size);
  ModelConfig c = full;
  if (tp_size == 1) return c;
  bool any_mla = false, any_kda = false, any_dense = false, any_moe = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    (c.is_kda(l) ? any_kda : any_mla) = true;
    (c.is_moe(l) ? any_moe : any_dense) = true;
  }
  if (any_mla) divide(c.num_attention_heads, "num_attention_heads", tp_size);
  if (any_kda) divide(c.linear_num_heads, "linear_attn_config.num_heads", tp_size);
  if (any_dense) divide(c.intermediate_size, "intermediate_size", tp_size);
  if (any_moe && expert_parallel) {
    if (c.num_experts % tp_size != 0) {
      HYSERVE_THROW(ConfigError, "n_routed_experts = ", c.num_experts,
                    " is not divisible by the tensor-parallel size ", tp_size,
                    " (--enable-expert-parallel puts whole experts on ranks)");
    }
  } else if (any_moe) {
    divide(c.moe_intermediate_size, "moe_intermediate_size", tp_size);
  }
  // The vocabulary need not divide, but every rank must keep rows of it.
  if (vocab_shard(c.vocab_size, tp_size - 1, tp_size).rows == 0) {
    HYSERVE_THROW(ConfigError, "vocab_size = ", c.vocab_size, " leaves the last of ", tp_size,
                  " tensor-parallel ranks no rows of the embedding (shares of ",
                  vocab_shard(c.vocab_size, 0, tp_size).stride, " rows)");
  }
  return c;
}

void shard_weights(const ModelConfig& full, int rank, int size, LoadedWeights& w, int dcp,
                   bool expert_parallel) {
  CHECK(size >= 1 && rank >= 0 && rank < size, "tensor-parallel rank ", rank, " of ", size);
  ParallelLayout::check_sizes(size, dcp);
  if (size == 1) return;
  const Slicer s{w, rank, size};
  const ModelConfig& c = full;
  const VocabShard vocab = vocab_shard(c.vocab_size, rank, size);
  ModelWeights& top = w.views;
  top.embed = vocab_rows(top.embed, vocab, c.tensor_prefix + "model.embed_tokens");
  top.lm_head = c.tie_word_embeddings ? top.embed
                                      : vocab_rows(top.lm_head, vocab, c.tensor_prefix + "lm_head");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& lw = w.views.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    if (c.is_kda(l)) {
      KdaWeights& k = lw.kda;
      const int64_t h = c.linear_num_heads;
      const int64_t hd = c.linear_head_dim;
      k.q_proj = s.rows(k.q_proj, p + "q_proj");
      k.k_proj = s.rows(k.k_proj, p + "k_proj");
      k.v_proj = s.rows(k.v_proj, p + "v_proj");
      const int64_t kw = c.linear_conv_kernel;
      k.q_conv = s.part(k.q_conv, h * hd, kw, p + "q_conv1d");
      k.k_conv = s.part(k.k_conv, h * hd, kw, p + "k_conv1d");
      k.v_conv = s.part(k.v_conv, h * hd, kw, p + "v_conv1d");
      k.f_b_proj = s.rows(k.f_b_proj, p + "f_b_proj");
      k.b_proj = s.rows(k.b_proj, p + "b_proj");
      k.g_b_proj = s.rows(k.g_b_proj, p + "g_b_proj");
      k.g_proj = s.rows(k.g_proj, p + "g_proj");
      k.a_log = s.part(k.a_log, h, 1, p + "A_log");
      k.dt_bias = s.part(k.dt_bias, h, hd, p + "dt_bias");
      k.o_proj = s.cols(k.o_proj, p + "o_proj");
    } else {
      MlaWeights& a = lw.mla;
      a.q_proj = s.rows(a.q_proj, p + "q_proj");
      a.q_b_proj = s.rows(a.q_b_proj, p + "q_b_proj");
      // The DCP group's heads: a rank attends with every head of its group.
      a.kv_b_proj = row_shard(a.kv_b_proj, rank / dcp, size / dcp, p + "kv_b_proj");
      a.g_proj = s.rows(a.g_proj, p + "g_proj");
      a.o_proj = s.cols(a.o_proj, p + "o_proj");
    }
    if (c.is_moe(l)) {
      MoeWeights& m = lw.moe;
      if (expert_parallel) {
        // Whole experts, by index: the rank's [first, first + count).
        const ExpertShard es = expert_shard(static_cast<int64_t>(m.experts.size()), rank, size);
        m.experts = std::vector<MlpWeights>(m.experts.begin() + es.first,
                                            m.experts.begin() + es.first + es.count);
      } else {
        for (size_t e = 0; e < m.experts.size(); ++e) {
          s.mlp(m.experts[e], p + "experts." + std::to_string(e));
        }
      }
      if (m.has_shared) s.mlp(m.shared, p + "shared_experts");
    } else {
      s.mlp(lw.dense, p + "mlp");
    }
  }
}

}  // namespace hyserve
