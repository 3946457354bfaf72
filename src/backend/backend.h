// Backend: what the forward pass needs from a device: its memory, copies and ordering
// (Device, device.h) and the ops of MODEL.md behind their Params structs (the op table,
// ops.h). The model code (model.cpp) is written once against this interface; CpuBackend
// runs the fp32 reference ops, the CUDA backend (src/backend/cuda/) launches the CUDA
// kernels on its stream.
//
// Pointers in Params and in buffers are in the backend's memory (host memory for the
// CPU, device memory for CUDA). Weights are the backend's copies (see ModelWeights).
#pragma once

#include <cstddef>
#include <memory>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/weight.h"
#include "kernels/attention/dsa/params.h"
#include "kernels/attention/indexer/params.h"
#include "kernels/attention/latent/params.h"
#include "kernels/attention/merge/params.h"
#include "kernels/attention/mla/params.h"
#include "kernels/attention/topk_merge/params.h"
#include "kernels/cache/params.h"
#include "kernels/elementwise/params.h"
#include "kernels/kda/params.h"
#include "kernels/linear/params.h"
#include "kernels/logits/params.h"
#include "kernels/lora/params.h"
#include "kernels/mlp/params.h"
#include "kernels/moe/params.h"
#include "kernels/norm/params.h"
#include "kernels/rope/params.h"
#include "kernels/sampling/params.h"
#include "util/error.h"

namespace hyserve {

// A backend: a Device (device.h) that also runs the op table (ops.h). Each op forwards
// to the device's kernel for its Params struct.
class Backend : public Device {
 public:
  // Batch-invariant mode: every op computes a token's (or query's) result with the same
  // instructions in the same order whatever the other tokens of the call are and however
  // many there are, so its bits depend on that token alone (ModelOptions::batch_invariant).
  // The CPU ops always are; the CUDA backend then gives up shape-tuned kernels (cuBLAS,
  // split-KV plans) for fixed ones.
  virtual void set_batch_invariant(bool /*on*/) {}
  // How the CPU backend multiplies by weight matrices outside batch-invariant mode
  // (kernels/linear/params.h CpuGemm; ModelOptions::cpu_gemm). Other backends ignore it.
  virtual void set_cpu_gemm(cpu::CpuGemm /*gemm*/) {}
  // The model's weights moved to new addresses (sleep mode's wake-up): tables the backend
  // built from weight addresses (the CUDA MoE's expert pointers) are built again, now (the
  // backend is not frozen while this runs).
  virtual void weights_moved() {}

  // The ops (ops.h). linears: several linears of one input (the same x, num_tokens and
  // input width), each result as linear() gives it; a backend may share work on x (the
  // CUDA tensor-core path rounds it to bf16 once). sample_tokens: options must satisfy
  // sampling::options_valid (checked by the caller on the host); a row whose logits are
  // all NaN gets token -1 on every backend. gather_tokens: a step's input ids taken from
  // the tokens a step before it sampled, without a trip to the host.
#define HYSERVE_DECLARE_OP(name, P, cuda) virtual void name(const P& p) = 0;
  HYSERVE_BACKEND_OPS(HYSERVE_DECLARE_OP)
#undef HYSERVE_DECLARE_OP

  // Op scratch memory (not the model's Workspace) a dsa_decode of these sizes takes: 0 on
  // the CPU (its reference allocates), the CUDA kernels' workspace otherwise.
  virtual size_t dsa_decode_scratch_bytes(const DsaDecodeParams& /*p*/) {
    return 0;
  }
  // Op scratch memory an mla_attention call of these sizes takes (the same way: 0 on the
  // CPU).
  virtual size_t mla_attention_scratch_bytes(const MlaAttentionParams& /*p*/) {
    return 0;
  }
  // Grows the op scratch memory to at least num_bytes now (before freeze(), so that a
  // later op of that size neither allocates nor fails).
  virtual void reserve_scratch(size_t /*num_bytes*/) {}
};

// The fp32 reference backend on host memory (src/kernels/*/cpu.cpp).
std::unique_ptr<Backend> make_cpu_backend();
// The CUDA kernels on GPU `device` (src/backend/cuda/). Throws when the build has no
// CUDA backend or the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// Whether this build includes the CUDA backend.
bool cuda_backend_built();
// CUDA devices this process can use: 0 without the CUDA backend, a driver or a GPU.
int cuda_device_count();

}  // namespace hyserve
