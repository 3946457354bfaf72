// Backend: what the forward pass needs from a device: memory, copies, and the ops of
// MODEL.md behind their Params structs. The model code (model.cpp) is written once
// against this interface; CpuBackend runs the fp32 reference ops, the CUDA backend
// (src/backend/cuda/) launches the CUDA kernels on its stream.
//
// Pointers in Params and in buffers are in the backend's memory (host memory for the
// CPU, device memory for CUDA). Weights are the backend's copies (see ModelWeights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "core/weight.h"
#include "kernels/attention_merge/params.h"
#include "kernels/cache/params.h"
#include "kernels/dsa/params.h"
#include "kernels/elementwise/params.h"
#include "kernels/indexer/params.h"
#include "kernels/kda/params.h"
#include "kernels/latent/params.h"
#include "kernels/linear/params.h"
#include "kernels/logits/params.h"
#include "kernels/mla/params.h"
#include "kernels/mlp/params.h"
#include "kernels/moe/params.h"
#include "kernels/norm/params.h"
#include "kernels/rope/params.h"
#include "kernels/sampling/params.h"
#include "kernels/topk_merge/params.h"
#include "util/error.h"

namespace hyserve {

enum class DeviceKind { kCpu, kCuda };

class Backend;

// One allocation in a backend's memory (or, kHost, the host memory it copies into
// without staging: Backend::allocate_host), freed on destruction. Setup only: the forward
// pass itself never allocates.
class BackendBuffer {
 public:
  enum class Memory { kDevice, kHost };
  BackendBuffer() = default;
  BackendBuffer(Backend* backend, size_t num_bytes, Memory memory = Memory::kDevice);
  ~BackendBuffer();
  BackendBuffer(BackendBuffer&& o) noexcept;
  BackendBuffer& operator=(BackendBuffer&& o) noexcept;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void free();

  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Memory memory_ = Memory::kDevice;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;

  // Memory (setup time). allocate() returns zeroed, 256-byte aligned memory.
  virtual void* allocate(size_t num_bytes) = 0;
  virtual void release(void* ptr) = 0;
  // Ordered with the ops: device-to-device, host-to-device, device-to-host.
  virtual void copy(void* dst, const void* src, size_t num_bytes) = 0;
  virtual void upload(void* dst, const void* host_src, size_t num_bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t num_bytes) = 0;
  virtual void fill_zero(void* dst, size_t num_bytes) = 0;
  // Waits until every op issued so far is done.
  virtual void synchronize() = 0;
  // Host memory a device copies into without a staging copy (pinned on CUDA), for
  // download_async. The default is plain host memory.
  virtual void* allocate_host(size_t num_bytes);
  virtual void release_host(void* ptr);
  // A device-to-host copy ordered with the ops that does not wait for them: host_dst (from
  // allocate_host) holds the bytes once a fence issued after it has been waited for. The
  // default copies at once (a backend whose ops run on the caller's thread).
  virtual void download_async(void* host_dst, const void* src, size_t num_bytes) {
    download(host_dst, src, num_bytes);
  }
  // A fence after every op issued so far; wait_fence(f) returns once they are all done
  // (fences are waited for at most once, in any order; waiting for a later one also ends
  // the earlier ones). The defaults: ops are done when issued.
  virtual uint64_t fence() { return 0; }
  virtual void wait_fence(uint64_t /*fence*/) {}
  // After freeze() the backend allocates nothing (CUDA graphs replay safely); an op
  // that would need more scratch memory than it had throws.
  virtual void freeze() {}
  // Batch-invariant mode: every op computes a token's (or query's) result with the same
  // instructions in the same order whatever the other tokens of the call are and however
  // many there are, so its bits depend on that token alone (ModelOptions::batch_invariant).
  // The CPU ops always are; the CUDA backend then gives up shape-tuned kernels (cuBLAS,
  // split-KV plans) for fixed ones.
  virtual void set_batch_invariant(bool /*on*/) {}
  // The device stream ops are issued on (cudaStream_t for CUDA), or null.
  virtual void* native_stream() const { return nullptr; }

  // Graphs (CUDA graphs for decode). capture_graph records the ops `fn` issues into graph
  // `id` without running them, replacing an earlier graph of that id; replay_graph runs
  // it. The ops read and write the same memory at every replay; fn must not allocate.
  virtual bool supports_graphs() const { return false; }
  virtual void capture_graph(int64_t id, const std::function<void()>& fn) {
    HYSERVE_THROW(InvalidArgument, "this backend has no graphs (graph ", id, ")");
  }
  virtual void replay_graph(int64_t id) {
    HYSERVE_THROW(InvalidArgument, "this backend has no graphs (graph ", id, ")");
  }
  // Frees graph `id` (none captured: nothing to do).
  virtual void release_graph(int64_t /*id*/) {}

  // Ops (MODEL.md); each forwards to the device's kernel for that Params struct.
  virtual void linear(const LinearParams& p) = 0;
  // Several linears of one input (the same x, num_tokens and input width): each result as
  // linear() gives it; a backend may share work on x (the CUDA tensor-core path rounds it to
  // bf16 once).
  virtual void linears(const LinearsParams& p) {
    for (const LinearParams& l : p.linears) linear(l);
  }
  virtual void embedding_lookup(const EmbeddingParams& p) = 0;
  virtual void rms_norm(const RmsNormParams& p) = 0;
  virtual void layer_norm(const LayerNormParams& p) = 0;
  virtual void attn_res_norm(const AttnResNormParams& p) = 0;
  virtual void rope(const RopeOpParams& p) = 0;
  virtual void mla_attention(const MlaAttentionOpParams& p) = 0;
  virtual void hadamard_rotate(const HadamardParams& p) = 0;
  virtual void quantize_fp8_ue8m0(const QuantizeFp8Ue8m0Params& p) = 0;
  virtual void indexer_scores(const IndexerScoreParams& p) = 0;
  virtual void indexer_scores_fp8_cache(const IndexerFp8CacheScoreParams& p) = 0;
  virtual void causal_topk(const CausalTopkParams& p) = 0;
  virtual void short_conv_silu(const ShortConvParams& p) = 0;
  virtual void kda_gate(const KdaGateParams& p) = 0;
  virtual void l2norm_rows(const L2NormRowsParams& p) = 0;
  virtual void kda_recurrent(const KdaParams& p) = 0;
  virtual void kda_chunked(const KdaParams& p) = 0;
  virtual void gated_rms_norm(const GatedRmsNormParams& p) = 0;
  virtual void kda_decode(const KdaDecodeParams& p) = 0;
  virtual void mlp(const MlpParams& p) = 0;
  virtual void route_experts(const RouterParams& p) = 0;
  virtual void moe(const MoeParams& p) = 0;

  // Elementwise helpers over n floats (kernels/elementwise/params.h).
  virtual void add(const ResidualAddParams& p) = 0;          // h += x
  virtual void sigmoid_mul(const SigmoidGateParams& p) = 0;  // o *= sigmoid(g)
  virtual void sigmoid(const SigmoidParams& p) = 0;          // x = sigmoid(x)
  virtual void scale(const ScaleParams& p) = 0;              // x *= scale
  virtual void copy_2d(const Copy2dParams& p) = 0;           // a strided block copy
  // Writes rows into their slots of a paged cache (kernels/cache/params.h).
  virtual void scatter_rows(const ScatterRowsParams& p) = 0;
  // Reads a sequence's rows of a paged cache into a contiguous buffer (the same params.h).
  virtual void gather_rows(const GatherRowsParams& p) = 0;

  // Decode context parallelism: a rank's causal positions and cache slots
  // (kernels/elementwise/params.h), the log-sum-exp merge of partial attention results
  // (kernels/attention_merge/params.h).
  virtual void dcp_localize(const DcpLocalizeParams& p) = 0;
  virtual void attention_merge(const AttentionMergeParams& p) = 0;
  // The steps of the DSA indexer's exact top-k merge, between the communicator's
  // all_gathers (kernels/topk_merge/params.h).
  virtual void topk_merge_pack(const TopkMergeParams& p) = 0;
  virtual void topk_merge_decide(const TopkMergeParams& p) = 0;
  virtual void topk_merge_resend_pack(const TopkMergeParams& p) = 0;
  virtual void topk_merge_resend_decide(const TopkMergeParams& p) = 0;

  // The FP8 latent cache (kernels/latent/params.h, kernels/dsa/params.h).
  virtual void mul(const MulParams& p) = 0;  // y *= x
  virtual void quantize_e4m3(const QuantizeE4m3Params& p) = 0;
  virtual void round_bf16(const RoundBf16Params& p) = 0;
  virtual void mla_absorb_q(const MlaAbsorbParams& p) = 0;
  virtual void mla_project_uv(const MlaProjectParams& p) = 0;
  virtual void dsa_query_slots(const DsaQuerySlotsParams& p) = 0;
  // Sparse or dense MLA over the packed FP8 latent; indexer -> top-k -> sparse MLA.
  virtual void dsa_mla_decode(const DsaMlaParams& p) = 0;
  virtual void dsa_decode(const DsaDecodeParams& p) = 0;
  // Op scratch memory (not the model's Workspace) a dsa_decode of these sizes takes: 0 on
  // the CPU (its reference allocates), the CUDA kernels' workspace otherwise.
  virtual size_t dsa_decode_scratch_bytes(const DsaDecodeParams& /*p*/) { return 0; }
  // Grows the op scratch memory to at least num_bytes now (before freeze(), so that a
  // later op of that size neither allocates nor fails).
  virtual void reserve_scratch(size_t /*num_bytes*/) {}

  // Logits processing, log-probabilities and sampling over rows of logits in this
  // backend's memory (kernels/logits/params.h, kernels/sampling/params.h): the model
  // runner's logits processors; only sampled ids and asked-for logprobs leave the device.
  virtual void apply_penalties(const PenaltyParams& p) = 0;
  virtual void count_tokens(const CountTokensParams& p) = 0;
  virtual void adjust_logits(const LogitAdjustParams& p) = 0;
  virtual void apply_token_mask(const TokenMaskParams& p) = 0;
  virtual void token_logprobs(const LogprobParams& p) = 0;
  // Options must satisfy sampling::options_valid (checked by the caller on the host); a
  // row whose logits are all NaN gets token -1 on every backend.
  virtual void sample_tokens(const SampleParams& p) = 0;
  // tokens[i] = source[source_rows[i]] where source_rows[i] >= 0: a step's input ids taken
  // from the tokens a step before it sampled, without a trip to the host.
  virtual void gather_tokens(const GatherTokensParams& p) = 0;
};

// The fp32 reference backend on host memory (src/kernels/*/cpu.cpp).
std::unique_ptr<Backend> make_cpu_backend();
// The CUDA kernels on GPU `device` (src/backend/cuda/). Throws when the build has no
// CUDA backend or the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// Whether this build includes the CUDA backend.
bool cuda_backend_built();

}  // namespace hyserve
