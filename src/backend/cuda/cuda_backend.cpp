// CudaBackend: the Backend interface on one GPU. Every op is launched on the
// backend's stream; ops that need scratch memory share one workspace buffer (ops
// run in stream order, so one suffices). Per-weight device structures (the MoE
// expert tables, the RoPE table) are built on first use; the model runner's warm-up
// step builds them all, and freeze() then forbids any allocation, so captured CUDA
// graphs replay without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "core/cuda/device_buffer.h"
#include "kernels/attention/dsa/cuda.h"
#include "kernels/attention/indexer/cuda.h"
#include "kernels/attention/latent/cuda.h"
#include "kernels/attention/merge/cuda.h"
#include "kernels/attention/mla/cuda.h"
#include "kernels/attention/topk_merge/cuda.h"
#include "kernels/cache/cuda.h"
#include "kernels/elementwise/cuda.h"
#include "kernels/kda/cuda.h"
#include "kernels/linear/cuda.h"
#include "kernels/logits/cuda.h"
#include "kernels/lora/cuda.h"
#include "kernels/mlp/cuda.h"
#include "kernels/moe/cuda.h"
#include "kernels/norm/cuda.h"
#include "kernels/rope/cuda.h"
#include "kernels/sampling/cuda.h"
#include "util/cuda_check.h"

namespace hyserve {
namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    blas_ = std::make_unique<cuda::Blas>(stream_);
  }
  ~CudaBackend() override {
    for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(exec);
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [id, e] : fences_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    blas_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  void* native_stream() const override { return stream_; }

  bool supports_graphs() const override { return true; }
  void capture_graph(int64_t id, const std::function<void()>& fn) override {
    // Relaxed: launchers may set kernel attributes while capturing; nothing allocates.
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    cudaGraph_t graph = nullptr;
    try {
      fn();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(st);
    const auto it = graphs_.find(id);
    if (it != graphs_.end()) cudaGraphExecDestroy(it->second);
    graphs_[id] = exec;
  }
  void replay_graph(int64_t id) override {
    const auto it = graphs_.find(id);
    CHECK(it != graphs_.end(), "no CUDA graph ", id, " was captured");
    CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  }
  void release_graph(int64_t id) override {
    const auto it = graphs_.find(id);
    if (it == graphs_.end()) return;
    cudaGraphExecDestroy(it->second);
    graphs_.erase(it);
  }
  void freeze() override { frozen_ = true; }
  void unfreeze() override { frozen_ = false; }
  bool frozen() const override { return frozen_; }
  void weights_moved() override {
    for (auto& [experts, table] : experts_) {
      table = cuda::MoeExperts::upload(experts, table.num_experts());
    }
  }
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }

  void* allocate(size_t n) override {
    CHECK(!frozen_, "allocation of ", n, " bytes after the CUDA backend was frozen");
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1)));
    CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream_));
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void copy(void* dst, const void* src, size_t n) override {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_));
  }
  void upload(void* dst, const void* src, size_t n) override {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
  }
  void download(void* dst, const void* src, size_t n) override {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void fill_zero(void* dst, size_t n) override {
    if (n) CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream_));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  std::optional<DeviceMemoryInfo> memory_info() const override {
    CUDA_CHECK(cudaSetDevice(device_));
    const cuda::MemoryInfo m = cuda::memory_info();
    return DeviceMemoryInfo{m.free_bytes, m.total_bytes};
  }
  void* allocate_host(size_t n) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(n, 1)));
    std::memset(p, 0, std::max<size_t>(n, 1));
    return p;
  }
  void release_host(void* p) override { cudaFreeHost(p); }
  void download_async(void* dst, const void* src, size_t n) override {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
  }
  uint64_t fence() override {
    cudaEvent_t e = nullptr;
    if (free_events_.empty()) {
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    CUDA_CHECK(cudaEventRecord(e, stream_));
    fences_.emplace_back(++last_fence_, e);
    return last_fence_;
  }
  void wait_fence(uint64_t f) override {
    // Fences complete in order (one stream): waiting for f ends every earlier one too.
    while (!fences_.empty() && fences_.front().first <= f) {
      const auto [id, e] = fences_.front();
      fences_.pop_front();
      if (id == f) CUDA_CHECK(cudaEventSynchronize(e));
      free_events_.push_back(e);
    }
  }

  // The op table: STREAM ops launch cuda::name(p, stream_); OWN ops are defined below the
  // class (they take the scratch workspace, cuBLAS, per-weight device tables or the
  // batch-invariant choice).
#define HYSERVE_CUDA_OP_STREAM(name, P) \
  void name(const P& p) override {      \
    cuda::name(p, stream_);             \
  }
#define HYSERVE_CUDA_OP_OWN(name, P) void name(const P& p) override;
#define HYSERVE_CUDA_OP(name, P, how) HYSERVE_CUDA_OP_##how(name, P)
  HYSERVE_BACKEND_OPS(HYSERVE_CUDA_OP)
#undef HYSERVE_CUDA_OP
#undef HYSERVE_CUDA_OP_OWN
#undef HYSERVE_CUDA_OP_STREAM

  size_t dsa_decode_scratch_bytes(const DsaDecodeParams& p) override {
    return cuda::dsa_decode_workspace_bytes(p);
  }
  size_t mla_attention_scratch_bytes(const MlaAttentionParams& p) override;
  void reserve_scratch(size_t num_bytes) override {
    scratch(num_bytes);
  }

 private:
  cuda::LinearKernel linear_kernel() const {
    return batch_invariant_ ? cuda::LinearKernel::kBatchInvariant : cuda::LinearKernel::kAuto;
  }

  // The shared op workspace, grown (before freeze) to the largest request seen. A
  // smaller one it replaces stays allocated: captured graphs may still use it.
  void* scratch(size_t bytes) {
    if (bytes == 0) return nullptr;
    if (workspace_.size() < bytes) {
      CHECK(!frozen_, "op workspace of ", bytes, " bytes exceeds the ", workspace_.size(),
            " sized before the CUDA backend was frozen");
      const size_t old_size = workspace_.size();
      if (old_size > 0) retired_.push_back(std::move(workspace_));
      workspace_ = cuda::DeviceBuffer(std::max(bytes, 2 * old_size));
    }
    return workspace_.data();
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Blas> blas_;
  cuda::DeviceBuffer workspace_;
  std::vector<cuda::DeviceBuffer> retired_;  // earlier op workspaces (graphs may use them)
  std::map<int64_t, cudaGraphExec_t> graphs_;
  std::map<const RopeTable*, cuda::DeviceRopeTable> rope_tables_;
  std::map<const MlpWeights*, cuda::MoeExperts> experts_;
  std::deque<std::pair<uint64_t, cudaEvent_t>> fences_;  // recorded, not yet waited for
  std::vector<cudaEvent_t> free_events_;
  uint64_t last_fence_ = 0;
  bool frozen_ = false;
  bool batch_invariant_ = false;
};

void CudaBackend::linear(const LinearParams& p) {
  const size_t need = cuda::linear_workspace_bytes(*p.w, p.num_tokens);
  cuda::linear(p, *blas_, scratch(need), need, stream_, linear_kernel());
}

void CudaBackend::linears(const LinearsParams& p) {
  const size_t need = cuda::linears_workspace_bytes(p.linears);
  cuda::linears(p.linears, *blas_, scratch(need), need, stream_, linear_kernel());
}

void CudaBackend::mlp(const MlpParams& p) {
  const size_t need = cuda::mlp_workspace_bytes(*p.w, p.num_tokens);
  cuda::mlp(p, *blas_, scratch(need), need, stream_, linear_kernel());
}

void CudaBackend::lora_add(const LoraParams& p) {
  cuda::lora_add(p, stream_);
}

void CudaBackend::route_experts(const RouterParams& p) {
  const size_t need = cuda::router_workspace_bytes(p.num_tokens, p.num_experts, p.gate->cols);
  // The router's tensor-core logits (past 16 tokens) once measured on a GPU (BENCHMARKS.md).
  constexpr bool kRouterTensorCores = false;
  cuda::route_experts(p, scratch(need), need, stream_, kRouterTensorCores ? blas_.get() : nullptr);
}

void CudaBackend::moe(const MoeParams& p) {
  // Routed experts' adapters: the kernels read the device table's block (moe_lora.cuh).
  CHECK(p.expert_lora == nullptr || p.expert_lora_table != nullptr,
        "moe: routed experts' LoRA adapters without their device table");
  auto it = experts_.find(p.experts);
  if (it == experts_.end()) {
    CHECK(!frozen_, "MoE experts first used after the CUDA backend was frozen");
    it = experts_.emplace(p.experts, cuda::MoeExperts::upload(p.experts, p.num_experts)).first;
  }
  const size_t need = cuda::moe_workspace_bytes(it->second, p.shared, p.num_tokens, p.top_k);
  cuda::moe(p, it->second, *blas_, scratch(need), need, stream_, batch_invariant_);
}

void CudaBackend::rope(const RopeOpParams& p) {
  auto it = rope_tables_.find(p.table);
  if (it == rope_tables_.end()) {
    CHECK(!frozen_, "RoPE table first used after the CUDA backend was frozen");
    it = rope_tables_.emplace(p.table, cuda::DeviceRopeTable::upload(*p.table)).first;
  }
  if (p.neox) {
    cuda::apply_rope_neox(it->second, p.rope, stream_);
  } else {
    cuda::apply_rope_interleaved(it->second, p.rope, stream_);
  }
}

// Dense MLA prefill on tensor cores (kernels/attention/mla/cuda.h: the expanded flash path,
// the absorbed GEMMs for kv_b adapters): on, since its GPU tests passed and it measured 160x
// the fp32 kernel (BENCHMARKS.md); HYSERVE_MLA_GEMM_PREFILL=0 turns it off for a process, to
// measure the two beside each other (docs/DECISIONS.md, "Dense MLA prefill in the expanded form").
bool mla_gemm_prefill() {
  static const bool on = [] {
    const char* env = std::getenv("HYSERVE_MLA_GEMM_PREFILL");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return on;
}

size_t CudaBackend::mla_attention_scratch_bytes(const MlaAttentionParams& p) {
  return cuda::mla_attention_call_workspace_bytes(p, mla_gemm_prefill(), batch_invariant_);
}

void CudaBackend::mla_attention(const MlaAttentionOpParams& p) {
  // The GPU runs the absorbed form for prefill and decode alike. The scratch is this call's
  // (the warm-up step sizes prefill, Model::reserve_decode_scratch decode batches and kv_b
  // adapters).
  const bool gemm = mla_gemm_prefill();
  const size_t need = mla_attention_scratch_bytes(p.attn);
  cuda::mla_attention_absorbed(p.attn, scratch(need), need, stream_, batch_invariant_,
                               gemm ? blas_.get() : nullptr);
}

void CudaBackend::kda_chunked(const KdaParams& p) {
  const size_t need = cuda::kda_chunked_workspace_bytes(p);
  cuda::kda_chunked(p, scratch(need), need, stream_);
}

void CudaBackend::copy_2d(const Copy2dParams& p) {
  if (p.rows == 0 || p.width == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(p.dst, static_cast<size_t>(p.dst_stride) * 4, p.src,
                               static_cast<size_t>(p.src_stride) * 4,
                               static_cast<size_t>(p.width) * 4, static_cast<size_t>(p.rows),
                               cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::dsa_mla_decode(const DsaMlaParams& p) {
  const size_t need = cuda::dsa_mla_workspace_bytes(p);
  cuda::dsa_mla_decode(p, scratch(need), need, stream_, batch_invariant_);
}

void CudaBackend::dsa_decode(const DsaDecodeParams& p) {
  const size_t need = cuda::dsa_decode_workspace_bytes(p);
  cuda::dsa_decode(p, scratch(need), need, stream_, batch_invariant_);
}

}  // namespace

bool cuda_backend_built() {
  return true;
}

int cuda_device_count() {
  return cuda::device_count();
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  CHECK(cuda::device_count() > device, "--device cuda: no CUDA device ", device, " (found ",
        cuda::device_count(), ")");
  return std::make_unique<CudaBackend>(device);
}

}  // namespace hyserve
