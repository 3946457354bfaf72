// TimingBackend: a Backend decorator for benchmarks. It forwards every op to a CUDA
// backend and brackets it with CUDA events, recording the op's name, the model
// section it ran in (Model::set_trace), and the bytes it must move and the FLOPs it
// must do (counted from its Params, documented per op in timing_backend.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace hyserve::bench {

struct OpRecord {
  std::string section;
  std::string op;
  double bytes = 0;
  double flops = 0;
  float time_us = 0;
};

class TimingBackend final : public Backend {
 public:
  explicit TimingBackend(std::unique_ptr<Backend> inner);
  ~TimingBackend() override;

  // Starts recording; section names come from set_section().
  void begin();
  // Waits for the stream and returns the records since begin().
  std::vector<OpRecord> end();
  void set_section(std::string_view s) { section_ = s; }

  DeviceKind kind() const override { return inner_->kind(); }
  void* allocate(size_t n) override { return inner_->allocate(n); }
  void release(void* p) override { inner_->release(p); }
  void copy(void* d, const void* s, size_t n) override;
  void upload(void* d, const void* s, size_t n) override { inner_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { inner_->download(d, s, n); }
  void fill_zero(void* d, size_t n) override { inner_->fill_zero(d, n); }
  void synchronize() override { inner_->synchronize(); }
  void* allocate_host(size_t n) override { return inner_->allocate_host(n); }
  void release_host(void* p) override { inner_->release_host(p); }
  void download_async(void* d, const void* s, size_t n) override {
    inner_->download_async(d, s, n);
  }
  uint64_t fence() override { return inner_->fence(); }
  void wait_fence(uint64_t f) override { inner_->wait_fence(f); }
  void freeze() override { inner_->freeze(); }
  void set_batch_invariant(bool on) override { inner_->set_batch_invariant(on); }
  void* native_stream() const override { return inner_->native_stream(); }
  // Graphs are captured while not recording: the ops pass straight to the inner backend.
  bool supports_graphs() const override { return inner_->supports_graphs(); }
  void capture_graph(int64_t id, const std::function<void()>& fn) override;
  void replay_graph(int64_t id) override { inner_->replay_graph(id); }
  void release_graph(int64_t id) override { inner_->release_graph(id); }

  void linear(const LinearParams& p) override;
  void linears(const LinearsParams& p) override;
  void embedding_lookup(const EmbeddingParams& p) override;
  void rms_norm(const RmsNormParams& p) override;
  void layer_norm(const LayerNormParams& p) override;
  void attn_res_norm(const AttnResNormParams& p) override;
  void rope(const RopeOpParams& p) override;
  void mla_attention(const MlaAttentionOpParams& p) override;
  void hadamard_rotate(const HadamardParams& p) override;
  void quantize_fp8_ue8m0(const QuantizeFp8Ue8m0Params& p) override;
  void indexer_scores(const IndexerScoreParams& p) override;
  void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p) override;
  void causal_topk(const CausalTopkParams& p) override;
  void short_conv_silu(const ShortConvParams& p) override;
  void kda_gate(const KdaGateParams& p) override;
  void l2norm_rows(const L2NormRowsParams& p) override;
  void kda_recurrent(const KdaParams& p) override;
  void kda_chunked(const KdaParams& p) override;
  void gated_rms_norm(const GatedRmsNormParams& p) override;
  void kda_decode(const KdaDecodeParams& p) override;
  void mlp(const MlpParams& p) override;
  void route_experts(const RouterParams& p) override;
  void moe(const MoeParams& p) override;
  void add(const ResidualAddParams& p) override;
  void sigmoid_mul(const SigmoidGateParams& p) override;
  void sigmoid(const SigmoidParams& p) override;
  void scale(const ScaleParams& p) override;
  void scatter_rows(const ScatterRowsParams& p) override;
  void gather_rows(const GatherRowsParams& p) override;
  void copy_2d(const Copy2dParams& p) override;
  void mul(const MulParams& p) override;
  void dcp_localize(const DcpLocalizeParams& p) override;
  void attention_merge(const AttentionMergeParams& p) override;
  void topk_merge_pack(const TopkMergeParams& p) override;
  void topk_merge_decide(const TopkMergeParams& p) override;
  void topk_merge_resend_pack(const TopkMergeParams& p) override;
  void topk_merge_resend_decide(const TopkMergeParams& p) override;
  void quantize_e4m3(const QuantizeE4m3Params& p) override;
  void round_bf16(const RoundBf16Params& p) override;
  void mla_absorb_q(const MlaAbsorbParams& p) override;
  void mla_project_uv(const MlaProjectParams& p) override;
  void dsa_query_slots(const DsaQuerySlotsParams& p) override;
  void dsa_mla_decode(const DsaMlaParams& p) override;
  void dsa_decode(const DsaDecodeParams& p) override;
  size_t dsa_decode_scratch_bytes(const DsaDecodeParams& p) override {
    return inner_->dsa_decode_scratch_bytes(p);
  }
  void reserve_scratch(size_t n) override { inner_->reserve_scratch(n); }
  // Logits processing and sampling pass straight through, untimed.
  void apply_penalties(const PenaltyParams& p) override { inner_->apply_penalties(p); }
  void count_tokens(const CountTokensParams& p) override { inner_->count_tokens(p); }
  void adjust_logits(const LogitAdjustParams& p) override { inner_->adjust_logits(p); }
  void apply_token_mask(const TokenMaskParams& p) override { inner_->apply_token_mask(p); }
  void token_logprobs(const LogprobParams& p) override { inner_->token_logprobs(p); }
  void sample_tokens(const SampleParams& p) override { inner_->sample_tokens(p); }
  void gather_tokens(const GatherTokensParams& p) override { inner_->gather_tokens(p); }

 private:
  template <typename F>
  void timed(const char* op, double bytes, double flops, F&& run);

  std::unique_ptr<Backend> inner_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;  // 2 per record, reused
  std::vector<OpRecord> records_;
  std::string section_;
  bool recording_ = false;
};

}  // namespace hyserve::bench
