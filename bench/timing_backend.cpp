#include "timing_backend.h"

#include <algorithm>
#include <cmath>

#include "util/cuda_check.h"

namespace hyserve::bench {

TimingBackend::TimingBackend(std::unique_ptr<Backend> inner)
    : inner_(std::move(inner)), stream_(static_cast<cudaStream_t>(inner_->native_stream())) {}

TimingBackend::~TimingBackend() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void TimingBackend::capture_graph(int64_t id, const std::function<void()>& fn) {
  CHECK(!recording_, "TimingBackend: graphs are captured outside begin() / end()");
  inner_->capture_graph(id, fn);
}

void TimingBackend::begin() {
  records_.clear();
  recording_ = true;
}

std::vector<OpRecord> TimingBackend::end() {
  recording_ = false;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < records_.size(); ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]));
    records_[i].time_us = ms * 1000.0f;
  }
  return std::move(records_);
}

template <typename F>
void TimingBackend::timed(const char* op, const OpCost& cost, F&& run) {
  if (!recording_ || !cost.timed) {
    run();
    return;
  }
  const size_t i = records_.size();
  while (events_.size() < 2 * (i + 1)) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(events_[2 * i], stream_));
  run();
  CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], stream_));
  records_.push_back({section_, op, cost.bytes, cost.flops, 0.0f});
}

// Bytes: every byte an op must read or write at least once (weights in their stored
// format, fp32 activations, the cache rows it attends over). FLOPs: multiply-adds x 2.

void TimingBackend::copy(void* d, const void* s, size_t n) {
  timed("copy", {2.0 * n, 0}, [&] { inner_->copy(d, s, n); });
}

namespace {

// One tag per op of the table, so that an op_cost overload names its op and not only its
// Params type (kda_recurrent and kda_chunked share KdaParams).
namespace op {
#define HYSERVE_OP_TAG(name, P, cuda) \
  struct name {};
HYSERVE_BACKEND_OPS(HYSERVE_OP_TAG)
#undef HYSERVE_OP_TAG
}  // namespace op

// An op without an op_cost overload below runs untimed.
template <typename Tag, typename P>
OpCost op_cost(Tag, const P&) {
  return {0, 0, false};
}

OpCost op_cost(op::linear, const LinearParams& p) {
  const double t = p.num_tokens, r = p.w->rows, c = p.w->cols;
  return {p.w->storage_bytes() + 4 * t * (r + c), 2 * t * r * c};
}

OpCost op_cost(op::linears, const LinearsParams& lp) {
  const std::span<const LinearParams> ps = lp.linears;
  double bytes = 0, flops = 0;
  for (const LinearParams& p : ps) {
    const double t = p.num_tokens, r = p.w->rows, c = p.w->cols;
    bytes += p.w->storage_bytes() + 4 * t * r;
    flops += 2 * t * r * c;
  }
  if (!ps.empty()) bytes += 4.0 * ps[0].num_tokens * ps[0].w->cols;
  return {bytes, flops};
}

OpCost op_cost(op::embedding_lookup, const EmbeddingParams& p) {
  return {p.num_tokens * p.table->cols * 6.0, 0};
}

OpCost op_cost(op::rms_norm, const RmsNormParams& p) {
  return {8.0 * p.num_rows * p.dim, 4.0 * p.num_rows * p.dim};
}

OpCost op_cost(op::attn_res_norm, const AttnResNormParams& p) {
  // Reads every candidate and the weights, writes y.
  const double elems = static_cast<double>(p.num_tokens) * p.dim;
  return {4.0 * elems * (p.num_snapshots + 2), 6.0 * elems * (p.num_snapshots + 2)};
}

OpCost op_cost(op::layer_norm, const LayerNormParams& p) {
  return {8.0 * p.num_rows * p.dim, 6.0 * p.num_rows * p.dim};
}

OpCost op_cost(op::rope, const RopeOpParams& op) {
  const RopeParams& p = op.rope;
  return {8.0 * p.num_tokens * p.num_heads * op.table->rotary_dim,
          6.0 * p.num_tokens * p.num_heads * op.table->rotary_dim};
}

OpCost op_cost(op::mla_attention, const MlaAttentionOpParams& op) {
  const MlaAttentionParams& p = op.attn;
  // Keys per query: the top-k set, or every causal key (decode: all S).
  const double t = p.num_tokens, s = p.num_keys, row = p.kv_lora + p.dr;
  const double keys = p.topk ? std::min<double>(p.topk_width, s) * t : t * (s - (t - 1) / 2.0);
  const double rows_read = p.topk ? std::min(s, keys) : s;
  const double kvb = p.kv_b->storage_bytes();
  const double absorb = 2.0 * t * p.num_heads * p.kv_lora * (p.dn + p.dv);
  return {rows_read * row * 4 + kvb + 4 * t * p.num_heads * (p.dn + p.dr + p.dv),
          2.0 * p.num_heads * keys * (row + p.kv_lora) + absorb};
}

OpCost op_cost(op::hadamard_rotate, const HadamardParams& p) {
  return {8.0 * p.rows * p.dim, p.rows * p.dim * std::log2(static_cast<double>(p.dim))};
}

OpCost op_cost(op::quantize_fp8_ue8m0, const QuantizeFp8Ue8m0Params& p) {
  return {5.0 * p.rows * p.dim, 2.0 * p.rows * p.dim};
}

OpCost op_cost(op::indexer_scores, const IndexerScoreParams& p) {
  const double t = p.num_tokens, s = p.num_keys, h = p.num_heads, d = p.head_dim;
  return {s * d * 4 + t * h * d * 4 + t * s * 4, 2 * t * h * s * d};
}

OpCost op_cost(op::indexer_scores_fp8_cache, const IndexerFp8CacheScoreParams& p) {
  const double t = p.num_tokens, s = p.num_keys, h = p.num_heads, d = p.head_dim;
  return {s * (d + 4) + t * h * d * 4 + t * s * 4, 2 * t * h * s * d};
}

OpCost op_cost(op::causal_topk, const CausalTopkParams& p) {
  return {4.0 * p.num_queries * p.num_keys + 4.0 * p.num_queries * p.topk, 0};
}

OpCost op_cost(op::short_conv_silu, const ShortConvParams& p) {
  return {8.0 * p.num_tokens * p.channels, 2.0 * p.num_tokens * p.channels * p.kernel_size};
}

OpCost op_cost(op::kda_gate, const KdaGateParams& p) {
  const double n = static_cast<double>(p.num_tokens) * p.num_heads * p.head_dim;
  return {8.0 * n, 10.0 * n};
}

OpCost op_cost(op::l2norm_rows, const L2NormRowsParams& p) {
  return {8.0 * p.rows * p.dim, 3.0 * p.rows * p.dim};
}

OpCost op_cost(op::kda_recurrent, const KdaParams& p) {
  const double t = p.num_tokens, h = p.num_heads, k = p.head_dim;
  return {2 * h * k * k * 4 + t * h * (4 * k + 1) * 4, t * h * k * k * 8};
}

OpCost op_cost(op::kda_chunked, const KdaParams& p) {
  const double t = p.num_tokens, h = p.num_heads, k = p.head_dim;
  return {2 * h * k * k * 4 + t * h * (5 * k + 1) * 4, t * h * (8 * k * k + 4 * 64 * k)};
}

OpCost op_cost(op::gated_rms_norm, const GatedRmsNormParams& p) {
  const double n = static_cast<double>(p.num_tokens) * p.num_heads * p.head_dim;
  return {12.0 * n, 8.0 * n};
}

OpCost op_cost(op::kda_decode, const KdaDecodeParams& p) {
  // Bytes: each state read and written once (recurrent and conv), per token the six
  // inputs and y; FLOPs: the delta rule's four products per state element and token.
  const double b = p.num_rows, t = p.num_tokens, h = p.num_heads, k = p.head_dim;
  const double w = p.kernel_size;
  return {2 * b * h * k * (k + 3 * (w - 1)) * 4 + t * h * (6 * k + 1) * 4, t * h * k * k * 8};
}

OpCost op_cost(op::mlp, const MlpParams& p) {
  const double t = p.num_tokens, d = p.w->down.rows, i = p.w->down.cols;
  const double wb = p.w->gate.storage_bytes() + p.w->up.storage_bytes() + p.w->down.storage_bytes();
  return {wb + 8 * t * d, 6 * t * d * i};
}

OpCost op_cost(op::route_experts, const RouterParams& p) {
  const double t = p.num_tokens, e = p.num_experts, d = p.gate->cols;
  return {p.gate->storage_bytes() + 4 * t * d, 2 * t * e * d};
}

OpCost op_cost(op::moe, const MoeParams& p) {
  // Expected distinct experts among T*k uniform picks: E (1 - (1 - k/E)^T).
  const MlpWeights& e0 = p.experts[0];
  const double t = p.num_tokens, e = p.num_experts, k = p.top_k;
  const double distinct = e * (1 - std::pow(1 - k / e, t));
  const double expert_bytes =
      e0.gate.storage_bytes() + e0.up.storage_bytes() + e0.down.storage_bytes();
  const double d = e0.down.rows, i = e0.down.cols;
  double bytes = distinct * expert_bytes + 8 * t * d, flops = 6 * t * k * d * i;
  if (p.shared) {
    bytes += p.shared->gate.storage_bytes() + p.shared->up.storage_bytes() +
             p.shared->down.storage_bytes();
    flops += 6 * t * d * p.shared->down.cols;
  }
  return {bytes, flops};
}

OpCost op_cost(op::residual_add, const ResidualAddParams& p) {
  return {12.0 * p.n, 1.0 * p.n};
}
OpCost op_cost(op::sigmoid_gate, const SigmoidGateParams& p) {
  return {12.0 * p.n, 4.0 * p.n};
}
OpCost op_cost(op::sigmoid, const SigmoidParams& p) {
  return {8.0 * p.n, 4.0 * p.n};
}
OpCost op_cost(op::scale, const ScaleParams& p) {
  return {8.0 * p.n, 1.0 * p.n};
}
OpCost op_cost(op::scatter_rows, const ScatterRowsParams& p) {
  return {2.0 * static_cast<double>(p.num_rows * p.row_bytes), 0};
}
OpCost op_cost(op::gather_rows, const GatherRowsParams& p) {
  return {2.0 * static_cast<double>(p.num_rows * p.row_bytes), 0};
}
OpCost op_cost(op::copy_2d, const Copy2dParams& p) {
  return {8.0 * p.rows * p.width, 0};
}

OpCost op_cost(op::mul, const MulParams& p) {
  return {12.0 * p.n, 1.0 * p.n};
}

OpCost op_cost(op::dcp_localize, const DcpLocalizeParams& p) {
  return {32.0 * p.n, 0};
}

OpCost op_cost(op::attention_merge, const AttentionMergeParams& p) {
  const double bytes = 4.0 * (p.num_parts + 1) * p.rows * (p.width + 1);
  return {bytes, 2.0 * p.num_parts * p.rows * p.width};
}

// The merge steps' bytes: the row's top-k lists and messages they read and write.
OpCost op_cost(op::topk_merge_pack, const TopkMergeParams& p) {
  return {p.rows * (16.0 * p.k + 4.0 * p.candidates), 0};
}

OpCost op_cost(op::topk_merge_decide, const TopkMergeParams& p) {
  return {p.rows * (4.0 * p.world * (p.candidates + 1) + 20.0 * p.k), 0};
}

OpCost op_cost(op::topk_merge_resend_pack, const TopkMergeParams& p) {
  return {16.0 * p.num_resend * p.k, 0};
}

OpCost op_cost(op::topk_merge_resend_decide, const TopkMergeParams& p) {
  return {p.num_resend * (8.0 * p.world * p.k + 20.0 * p.k), 0};
}

OpCost op_cost(op::round_bf16, const RoundBf16Params& p) {
  return {6.0 * p.n, 1.0 * p.n};
}

OpCost op_cost(op::quantize_e4m3, const QuantizeE4m3Params& p) {
  return {5.0 * p.n, 2.0 * p.n};
}
// Absorb / project: the kv_b weight in its stored format plus fp32 activations; 2 FLOPs
// per multiply-add of q_nope W_UK (dn x kv_lora per head) or W_UV o_lat (kv_lora x dv).
OpCost op_cost(op::mla_absorb_q, const MlaAbsorbParams& p) {
  const double rows = static_cast<double>(p.num_tokens * p.num_heads);
  const double bytes =
      static_cast<double>(p.kv_b->storage_bytes()) + 4.0 * rows * (p.dn + p.dr + p.kv_lora + p.dr);
  return {bytes, 2.0 * rows * p.dn * p.kv_lora};
}
OpCost op_cost(op::mla_project_uv, const MlaProjectParams& p) {
  const double rows = static_cast<double>(p.num_tokens * p.num_heads);
  const double bytes =
      static_cast<double>(p.kv_b->storage_bytes()) + 4.0 * rows * (p.kv_lora + p.dv);
  return {bytes, 2.0 * rows * p.dv * p.kv_lora};
}
OpCost op_cost(op::dsa_query_slots, const DsaQuerySlotsParams& p) {
  return {8.0 * static_cast<double>(p.num_tokens * p.topk), 0};
}
// Sparse MLA: each query reads its topk_width latents (576 B) and its q (fp32), writes
// o_lat and lse; 2 x (576 + 512) FLOPs per head and key.
OpCost op_cost(op::dsa_mla_decode, const DsaMlaParams& p) {
  const double rows = static_cast<double>(p.batch.num_requests * p.batch.num_q);
  const double keys = p.slots != nullptr ? static_cast<double>(p.topk_width)
                                         : static_cast<double>(p.batch.max_context);
  const double bytes = rows * keys * kDsaLatentDim +
                       4.0 * rows * p.num_heads * (kDsaLoraDim + kDsaRopeDim + kDsaLoraDim + 1);
  return {bytes, 2.0 * rows * p.num_heads * keys * (kDsaLatentDim + kDsaLoraDim)};
}
// The whole step: every request's index keys up to max_context (132 B each), the top-k
// latents, the queries and outputs; the indexer's and the attention's FLOPs.
OpCost op_cost(op::dsa_decode, const DsaDecodeParams& p) {
  const double rows = static_cast<double>(p.batch.num_requests * p.batch.num_q);
  const double ctx = static_cast<double>(p.batch.max_context);
  const double bytes = static_cast<double>(p.batch.num_requests) * ctx * kDsaIndexKeyBytes +
                       rows * p.topk * kDsaLatentDim +
                       4.0 * rows * p.num_heads * (kDsaLoraDim + kDsaRopeDim + kDsaLoraDim + 1);
  const double flops = 2.0 * rows * ctx * p.index_num_heads * kDsaIndexDim +
                       2.0 * rows * p.num_heads * p.topk * (kDsaLatentDim + kDsaLoraDim);
  return {bytes, flops};
}

}  // namespace

// Every op of the table: timed with its op_cost when it has one, else passed straight
// through (logits processing and sampling).
#define HYSERVE_TIMED_OP(name, P, cuda)                             \
  void TimingBackend::name(const P& p) {                            \
    timed(#name, op_cost(op::name{}, p), [&] { inner_->name(p); }); \
  }
HYSERVE_BACKEND_OPS(HYSERVE_TIMED_OP)
#undef HYSERVE_TIMED_OP

}  // namespace hyserve::bench
