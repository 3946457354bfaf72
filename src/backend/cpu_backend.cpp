// CpuBackend: host memory and the fp32 reference ops.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <sys/mman.h>

#include "backend/backend.h"
#include "kernels/attention_merge/cpu.h"
#include "kernels/cache/cpu.h"
#include "kernels/dsa/cpu.h"
#include "kernels/elementwise/cpu.h"
#include "kernels/indexer/cpu.h"
#include "kernels/kda/cpu.h"
#include "kernels/latent/cpu.h"
#include "kernels/logits/cpu.h"
#include "kernels/mla/cpu.h"
#include "kernels/rope/cpu.h"
#include "kernels/sampling/cpu.h"
#include "kernels/topk_merge/cpu.h"
#include "util/error.h"

namespace hyserve {

BackendBuffer::BackendBuffer(Backend* backend, size_t num_bytes, Memory memory)
    : backend_(backend), bytes_(num_bytes), memory_(memory) {
  if (num_bytes == 0) return;
  ptr_ = memory == Memory::kHost ? backend->allocate_host(num_bytes) : backend->allocate(num_bytes);
}

void BackendBuffer::free() {
  if (ptr_ == nullptr) return;
  if (memory_ == Memory::kHost) {
    backend_->release_host(ptr_);
  } else {
    backend_->release(ptr_);
  }
  ptr_ = nullptr;
}

BackendBuffer::~BackendBuffer() {
  free();
}

BackendBuffer::BackendBuffer(BackendBuffer&& o) noexcept
    : backend_(o.backend_),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      memory_(o.memory_) {}

BackendBuffer& BackendBuffer::operator=(BackendBuffer&& o) noexcept {
  if (this != &o) {
    free();
    backend_ = o.backend_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    memory_ = o.memory_;
  }
  return *this;
}

void* Backend::allocate_host(size_t num_bytes) {
  const size_t rounded = (std::max<size_t>(num_bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  CHECK(p != nullptr, "cannot allocate ", num_bytes, " bytes of host memory");
  std::memset(p, 0, rounded);
  return p;
}

void Backend::release_host(void* ptr) {
  std::free(ptr);
}

namespace {

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }

  void* allocate(size_t num_bytes) override {
    // 256-byte aligned, as cudaMalloc is: workspace offsets keep that alignment. Large
    // buffers (the KV pool) are anonymous mappings: zero pages cost nothing until written.
    const size_t rounded = (std::max<size_t>(num_bytes, 1) + 255) / 256 * 256;
    if (rounded >= kMapThresholdBytes) {
      void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      CHECK(p != MAP_FAILED, "out of host memory mapping ", num_bytes, " bytes");
      std::lock_guard lock(mu_);
      mapped_.emplace(p, rounded);
      return p;
    }
    void* p = std::aligned_alloc(256, rounded);
    CHECK(p != nullptr, "out of host memory allocating ", num_bytes, " bytes");
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* ptr) override {
    std::lock_guard lock(mu_);
    const auto it = mapped_.find(ptr);
    if (it == mapped_.end()) {
      std::free(ptr);
      return;
    }
    munmap(it->first, it->second);
    mapped_.erase(it);
  }
  void copy(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void upload(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void download(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void fill_zero(void* dst, size_t n) override { std::memset(dst, 0, n); }
  void synchronize() override {}

  void linear(const LinearParams& p) override { cpu::linear(p); }
  void embedding_lookup(const EmbeddingParams& p) override { cpu::embedding_lookup(p); }
  void rms_norm(const RmsNormParams& p) override { cpu::rms_norm(p); }
  void layer_norm(const LayerNormParams& p) override { cpu::layer_norm(p); }
  void attn_res_norm(const AttnResNormParams& p) override { cpu::attn_res_norm(p); }
  void rope(const RopeOpParams& p) override {
    if (p.neox) {
      cpu::apply_rope_neox(*p.table, p.rope);
    } else {
      cpu::apply_rope_interleaved(*p.table, p.rope);
    }
  }
  void mla_attention(const MlaAttentionOpParams& p) override {
    if (p.absorbed) {
      cpu::mla_attention_absorbed(p.attn);
    } else {
      cpu::mla_attention_expanded(p.attn);
    }
  }
  void hadamard_rotate(const HadamardParams& p) override {
    cpu::hadamard_rotate(p.x, p.rows, p.dim);
  }
  void quantize_fp8_ue8m0(const QuantizeFp8Ue8m0Params& p) override {
    cpu::quantize_fp8_ue8m0(p.x, p.rows, p.dim, p.q, p.scales);
  }
  void indexer_scores(const IndexerScoreParams& p) override { cpu::indexer_scores(p); }
  void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p) override {
    cpu::indexer_scores_fp8_cache(p);
  }
  void causal_topk(const CausalTopkParams& p) override {
    cpu::causal_topk(p.scores, p.q_pos, p.num_queries, p.num_keys, p.topk, p.out);
  }
  void short_conv_silu(const ShortConvParams& p) override { cpu::short_conv_silu(p); }
  void kda_gate(const KdaGateParams& p) override { cpu::kda_gate(p); }
  void l2norm_rows(const L2NormRowsParams& p) override {
    cpu::l2norm_rows(p.x, p.rows, p.dim, p.scale);
  }
  void kda_recurrent(const KdaParams& p) override { cpu::kda_recurrent(p); }
  void kda_chunked(const KdaParams& p) override { cpu::kda_chunked(p); }
  void gated_rms_norm(const GatedRmsNormParams& p) override { cpu::gated_rms_norm(p); }
  void kda_decode(const KdaDecodeParams& p) override { cpu::kda_decode(p); }
  void mlp(const MlpParams& p) override { cpu::mlp(p); }
  void route_experts(const RouterParams& p) override { cpu::route_experts(p); }
  void moe(const MoeParams& p) override { cpu::moe(p); }

  void add(const ResidualAddParams& p) override { cpu::residual_add(p); }
  void sigmoid_mul(const SigmoidGateParams& p) override { cpu::sigmoid_gate(p); }
  void sigmoid(const SigmoidParams& p) override { cpu::sigmoid(p); }
  void scale(const ScaleParams& p) override { cpu::scale(p); }
  void mul(const MulParams& p) override { cpu::mul(p); }
  void dcp_localize(const DcpLocalizeParams& p) override { cpu::dcp_localize(p); }
  void attention_merge(const AttentionMergeParams& p) override { cpu::attention_merge(p); }
  void topk_merge_pack(const TopkMergeParams& p) override { cpu::topk_merge_pack(p); }
  void topk_merge_decide(const TopkMergeParams& p) override { cpu::topk_merge_decide(p); }
  void topk_merge_resend_pack(const TopkMergeParams& p) override { cpu::topk_merge_resend_pack(p); }
  void topk_merge_resend_decide(const TopkMergeParams& p) override {
    cpu::topk_merge_resend_decide(p);
  }
  void scatter_rows(const ScatterRowsParams& p) override { cpu::scatter_rows(p); }
  void gather_rows(const GatherRowsParams& p) override { cpu::gather_rows(p); }
  void copy_2d(const Copy2dParams& p) override {
    for (int64_t r = 0; r < p.rows; ++r)
      std::memmove(p.dst + r * p.dst_stride, p.src + r * p.src_stride,
                   static_cast<size_t>(p.width) * 4);
  }
  void quantize_e4m3(const QuantizeE4m3Params& p) override { cpu::quantize_e4m3(p); }
  void round_bf16(const RoundBf16Params& p) override { cpu::round_bf16(p); }
  void mla_absorb_q(const MlaAbsorbParams& p) override { cpu::mla_absorb_q(p); }
  void mla_project_uv(const MlaProjectParams& p) override { cpu::mla_project_uv(p); }
  void dsa_query_slots(const DsaQuerySlotsParams& p) override { cpu::dsa_query_slots(p); }
  void dsa_mla_decode(const DsaMlaParams& p) override { cpu::dsa_mla_decode(p); }
  void dsa_decode(const DsaDecodeParams& p) override { cpu::dsa_decode(p); }
  void apply_penalties(const PenaltyParams& p) override { cpu::apply_penalties(p); }
  void count_tokens(const CountTokensParams& p) override { cpu::count_tokens(p); }
  void adjust_logits(const LogitAdjustParams& p) override { cpu::adjust_logits(p); }
  void apply_token_mask(const TokenMaskParams& p) override { cpu::apply_token_mask(p); }
  void token_logprobs(const LogprobParams& p) override { cpu::token_logprobs(p); }
  void sample_tokens(const SampleParams& p) override { cpu::sample_tokens(p); }
  void gather_tokens(const GatherTokensParams& p) override { cpu::gather_tokens(p); }

 private:
  static constexpr size_t kMapThresholdBytes = size_t{1} << 24;
  std::mutex mu_;                             // guards mapped_
  std::unordered_map<void*, size_t> mapped_;  // mmap'ed buffers and their sizes
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

#ifndef HYSERVE_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int) {
  HYSERVE_THROW(InvalidArgument,
                "this hyserve was built without the CUDA backend (HYSERVE_CUDA=OFF)");
}
bool cuda_backend_built() {
  return false;
}
#endif

}  // namespace hyserve
