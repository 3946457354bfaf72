// CpuBackend: host memory and the fp32 reference ops.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include <sys/mman.h>

#include "backend/backend.h"
#include "kernels/attention/dsa/cpu.h"
#include "kernels/attention/indexer/cpu.h"
#include "kernels/attention/latent/cpu.h"
#include "kernels/attention/merge/cpu.h"
#include "kernels/attention/mla/cpu.h"
#include "kernels/attention/topk_merge/cpu.h"
#include "kernels/cache/cpu.h"
#include "kernels/elementwise/cpu.h"
#include "kernels/kda/cpu.h"
#include "kernels/linear/params.h"
#include "kernels/logits/cpu.h"
#include "kernels/lora/params.h"
#include "kernels/mlp/params.h"
#include "kernels/moe/params.h"
#include "kernels/norm/params.h"
#include "kernels/rope/cpu.h"
#include "kernels/sampling/cpu.h"
#include "util/error.h"

namespace hyserve {

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

  // The ops that multiply by weight matrices (linear, linears, mlp, moe) run as set_cpu_gemm
  // asks (CpuGemm, kernels/linear/params.h; the reference by default), and always the
  // reference in batch-invariant mode.
  void set_batch_invariant(bool on) override {
    batch_invariant_ = on;
    update_gemm();
  }
  void set_cpu_gemm(cpu::CpuGemm gemm) override {
    requested_gemm_ = gemm;
    update_gemm();
  }

  // Every op of the table is cpu::name(p), and cpu::name(p, gemm_) for the ops that take a
  // CpuGemm: the fp32 reference, but for those GEMMs.
#define HYSERVE_CPU_OP(name, P, cuda)                                        \
  void name(const P& p) override {                                           \
    run(p, [](const P& q, auto... gemm) -> decltype(cpu::name(q, gemm...)) { \
      cpu::name(q, gemm...);                                                 \
    });                                                                      \
  }
  HYSERVE_BACKEND_OPS(HYSERVE_CPU_OP)
#undef HYSERVE_CPU_OP

 private:
  // op(p, gemm_) where the op takes a CpuGemm, else op(p).
  template <typename P, typename Op>
  void run(const P& p, Op op) {
    if constexpr (std::is_invocable_v<Op, const P&, cpu::CpuGemm>) {
      op(p, gemm_);
    } else {
      op(p);
    }
  }

  void update_gemm() {
    gemm_ = batch_invariant_ ? cpu::CpuGemm::kReference : requested_gemm_;
  }

  bool batch_invariant_ = false;
  cpu::CpuGemm requested_gemm_ = cpu::CpuGemm::kReference;
  cpu::CpuGemm gemm_ = cpu::CpuGemm::kReference;
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
int cuda_device_count() {
  return 0;
}
#endif

}  // namespace hyserve
