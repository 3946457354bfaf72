// CUDA MoE router and grouped experts (params.h; activations, ids and weights are
// device pointers; Weight / MlpWeights structs are host structs with device data).
//
// route_experts: logits by linear_gemv (exact fp32: the selection is a discrete
//   decision, so no bf16 rounding), then one block per token does sigmoid, bias,
//   grouped top-k and the weights with the CPU op's float expressions and tie rule.
// moe: slots (token, i) are bucketed by expert with a counting sort on the device;
//   each expert runs gate/up -> act(gate, up) -> down over its tokens (p.act, SiLU or
//   SiTU, for every expert and the shared MLP; fp32 with the CPU op's expression):
//     <= kMoeDecodeMaxTokens:    BF16 / FP8 / MXFP4 experts (MoeExperts::decode_kernels):
//                                the decode kernels (moe/cuda/moe_decode.cuh), mma.sync on
//                                weights streamed through shared memory (cp.async) and
//                                decoded in registers; fp32 activations as three
//                                bf16 terms (MoeDecodeInput::kFp32: every product exact,
//                                fp32 accumulate) or rounded to bf16 (kBf16)
//     < kMoeMmaMinTokens tokens: other experts: memory-bound GEMV (exact fp32, like
//                                linear_gemv)
//     > kMoeDecodeMaxTokens:     the same experts by MoeExperts::prefill_kernel(): BF16
//                                experts with hidden and inter multiples of 8 on CUTLASS's
//                                grouped GEMM (moe/cuda/grouped_gemm.h: rows gathered as
//                                bf16, TMA + warpgroup MMAs, outputs scattered to slots);
//                                the others with hidden and inter multiples of 64 on the
//                                prefill kernels (moe/cuda/moe_prefill.cuh), warpgroup MMAs
//                                on tiles of 128 positions, weights decoded to bf16 in
//                                shared memory
//     >= kMoeMmaMinTokens:       the other experts: mma bf16 tensor-core tiles on weights
//                                decoded in shared memory (linear/cuda/mma_tile.cuh)
//   Both tensor-core paths past the decode kernels: fp32 accumulate; x and act(gate, up)
//   are rounded to bf16; BF16 and MXFP4 weights are exact in bf16; FP8 tiles hold the
//   exact e4m3 values and the 128x128 block scale multiplies each 128-wide k block's fp32
//   partial sum; F32 / F16 weights are rounded to bf16.
//   With batch_invariant, every expert runs the mma_tile.cuh tiles
//   (kernels/linear/cuda/mma_tile.cuh, whose per-token results do not depend on the other tokens)
//   and the shared expert runs linear's batch-invariant kernel, so a token's output bits do not
//   depend on the batch at all. Per-slot outputs are combined in slot order (w_i * out_i, then +
//   shared(x)), as on the CPU; a token's result does not depend on the other tokens or on the order
//   of slots within a bucket.
//   With routed experts' LoRA adapters (p.expert_lora_table), every expert runs the GEMV kernel
//   (< kMoeMmaMinTokens) or the tiles, whose h is fp32, and moe/cuda/moe_lora.cuh adds each
//   position's adapter terms (gate and up before the activation, down after), fp32 in a fixed
//   order per position: against the CPU op, the paths' tolerances; a token without an adapter
//   on its experts gets the bits of the same paths without LoRA (in batch-invariant mode, the
//   bits of a call without LoRA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/device_buffer.h"
#include "kernels/linear/cuda.h"
#include "kernels/moe/params.h"

namespace hyserve::cuda {

inline constexpr int64_t kMoeMmaMinTokens = 16;
// Experts with at most this many tokens run the decode kernels when the experts allow
// them (MoeExperts::decode_kernels).
inline constexpr int64_t kMoeDecodeMaxTokens = 16;

// The decode kernels' activations: fp32 as three bf16 terms each (every product exact, the
// fp32 GEMV's precision), or rounded to bf16 (the prefill tiles' precision; fewer MMAs).
enum class MoeDecodeInput { kFp32, kBf16 };

// Which kernels run the experts with more than kMoeDecodeMaxTokens tokens (outside
// batch-invariant mode, which keeps the tiles of mma_tile.cuh).
enum class MoePrefillKernel {
  kTiles,      // the tensor-core tiles of linear/cuda/mma_tile.cuh
  kWarpgroup,  // moe/cuda/moe_prefill.cuh: BF16, FP8, MXFP4; hidden, inter multiples of 64
  kGrouped,    // CUTLASS's grouped GEMM (moe/cuda/grouped_gemm.h): BF16, multiples of 8
};

// The routed experts of one layer, prepared once at load time: a device table of each
// expert's data / scales pointers. All experts share one shape and format per
// projection (gate and up one format, down one format); upload() refuses otherwise.
class MoeExperts {
 public:
  MoeExperts() = default;

  // experts: host array [num_experts] of MlpWeights whose Weights point to device
  // memory (e.g. DeviceWeight::view()); they must outlive this object.
  static MoeExperts upload(const MlpWeights* experts, int64_t num_experts);

  int64_t num_experts() const { return num_experts_; }
  int64_t hidden() const { return layout_.down.rows; }
  int64_t inter() const { return layout_.gate.rows; }
  // Expert 0's weights: the shape and format every expert has.
  const MlpWeights& layout() const { return layout_; }
  const void* device_table() const { return table_.data(); }
  // Every expert's rows can be read in 16-byte chunks.
  bool gate_up_aligned() const { return gate_up_aligned_; }
  bool down_aligned() const { return down_aligned_; }
  // The decode kernels take these experts: BF16, FP8 or MXFP4, gate / up / down in one
  // format, rows in 16-byte chunks.
  bool decode_kernels() const { return decode_kernels_; }
  // The prefill kernels (moe/cuda/moe_prefill.cuh) take the experts with more tokens: the
  // decode kernels' formats, hidden and inter multiples of 64.
  bool prefill_kernels() const { return prefill_kernels_; }
  // CUTLASS's grouped GEMM takes these experts: the decode kernels' BF16 experts with
  // hidden and inter multiples of 8.
  bool grouped_gemm() const { return grouped_gemm_; }
  // What runs the experts past the decode kernels: kWarpgroup where it can, else kTiles
  // (kGrouped on request until it is measured: moe.cu's kGroupedByDefault). set_prefill_kernel
  // picks another one these experts allow (benchmarks and tests compare them) and refuses one they
  // do not.
  MoePrefillKernel prefill_kernel() const { return prefill_kernel_; }
  void set_prefill_kernel(MoePrefillKernel k);
  // MXFP4 gate and up (0) / down (1) of every expert have 4-byte aligned scale rows of
  // whole words (cols a multiple of 128): the decode kernels copy their scales
  // asynchronously (else byte by byte, slowly).
  bool scale_words(int i) const { return scale_words_[i]; }

 private:
  DeviceBuffer table_;
  MlpWeights layout_;
  int64_t num_experts_ = 0;
  bool gate_up_aligned_ = false;
  bool down_aligned_ = false;
  bool decode_kernels_ = false;
  bool prefill_kernels_ = false;
  bool grouped_gemm_ = false;
  MoePrefillKernel prefill_kernel_ = MoePrefillKernel::kTiles;
  bool scale_words_[2] = {false, false};
};

// logits [max_tokens, num_experts] fp32; past kSmallBatchMaxTokens tokens also the tensor-core
// path's three bf16 terms of x [3, max_tokens, hidden] and three partial logits.
size_t router_workspace_bytes(int64_t max_tokens, int64_t num_experts, int64_t hidden);

// Logits: up to kSmallBatchMaxTokens tokens, or without `blas`, or a gate that is not BF16,
// by linear_gemv; else on tensor cores without rounding: x = x0 + x1 + x2 as three bf16
// terms (every fp32 value of a normal range exactly), each term's product with the bf16
// gate exact in fp32 and accumulated in fp32 by cuBLAS, the three partial logits summed in
// term order. Either way exact fp32 up to summation order (the selection that follows is a
// discrete decision: no bf16 rounding of x). The GPU cannot throw: a token whose scores
// contain a NaN gets ids -1 and weights 0 (the CPU op throws); moe skips such slots.
void route_experts(const RouterParams& p, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, const Blas* blas = nullptr);

// Buckets, per-slot activations [max_tokens * top_k, inter] and outputs
// [max_tokens * top_k, hidden], and the shared expert's output and MLP workspace.
size_t moe_workspace_bytes(const MoeExperts& experts, const MlpWeights* shared, int64_t max_tokens,
                           int64_t top_k);

// p.experts is not read (the experts come from `experts`, which must have
// p.num_experts experts of hidden size p.hidden); p.shared is a host MlpWeights with
// device data, or null. Expert ids outside [0, num_experts) contribute nothing (the
// CPU op throws).
void moe(const MoeParams& p, const MoeExperts& experts, const Blas& blas, void* workspace,
         size_t workspace_bytes, cudaStream_t stream, bool batch_invariant = false,
         MoeDecodeInput decode_input = MoeDecodeInput::kFp32);

}  // namespace hyserve::cuda
