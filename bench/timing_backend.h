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

// What an op must move and compute (bytes, FLOPs); timed false: not recorded.
struct OpCost {
  double bytes = 0;
  double flops = 0;
  bool timed = true;
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
  std::optional<DeviceMemoryInfo> memory_info() const override { return inner_->memory_info(); }
  void* allocate_host(size_t n) override { return inner_->allocate_host(n); }
  void release_host(void* p) override { inner_->release_host(p); }
  void download_async(void* d, const void* s, size_t n) override {
    inner_->download_async(d, s, n);
  }
  uint64_t fence() override { return inner_->fence(); }
  void wait_fence(uint64_t f) override { inner_->wait_fence(f); }
  void freeze() override { inner_->freeze(); }
  void* native_stream() const override { return inner_->native_stream(); }
  // Graphs are captured while not recording: the ops pass straight to the inner backend.
  bool supports_graphs() const override { return inner_->supports_graphs(); }
  void capture_graph(int64_t id, const std::function<void()>& fn) override;
  void replay_graph(int64_t id) override { inner_->replay_graph(id); }
  void release_graph(int64_t id) override { inner_->release_graph(id); }

  void set_batch_invariant(bool on) override { inner_->set_batch_invariant(on); }
  size_t dsa_decode_scratch_bytes(const DsaDecodeParams& p) override {
    return inner_->dsa_decode_scratch_bytes(p);
  }
  size_t mla_attention_scratch_bytes(const MlaAttentionParams& p) override {
    return inner_->mla_attention_scratch_bytes(p);
  }
  void reserve_scratch(size_t n) override { inner_->reserve_scratch(n); }

  // The op table (backend/ops.h), each op recorded under its table name.
#define HYSERVE_TIMED_OP(name, P, cuda) void name(const P& p) override;
  HYSERVE_BACKEND_OPS(HYSERVE_TIMED_OP)
#undef HYSERVE_TIMED_OP

 private:
  template <typename F>
  void timed(const char* op, const OpCost& cost, F&& run);

  std::unique_ptr<Backend> inner_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;  // 2 per record, reused
  std::vector<OpRecord> records_;
  std::string section_;
  bool recording_ = false;
};

}  // namespace hyserve::bench
