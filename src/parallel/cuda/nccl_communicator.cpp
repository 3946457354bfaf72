#include "parallel/cuda/nccl_communicator.h"

#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "util/cuda_check.h"

namespace hyserve::parallel {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::microseconds(50);

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(Store& store, int rank, int size, int device, cudaStream_t stream,
                   std::chrono::milliseconds timeout, const std::string& prefix)
      : rank_(rank), size_(size), stream_(stream), timeout_(timeout) {
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    CUDA_CHECK(cudaSetDevice(device));
    float* scratch = nullptr;
    CUDA_CHECK(cudaMalloc(&scratch, sizeof(float)));
    scratch_.reset(scratch);
    ncclUniqueId id;
    const std::string key = prefix + "/nccl_unique_id";
    if (rank == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store.set(key, Bytes(p, p + sizeof(id)));
    } else {
      const Bytes v = store.get(key, timeout);
      if (v.size() != sizeof(id))
        throw CommError(str_cat("NCCL init on rank ", rank, " of ", size, ": store key '", key,
                                "' holds ", v.size(), " bytes, not an ncclUniqueId"));
      std::memcpy(&id, v.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
    wait_ready("init");
  }

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    if (finalize()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* data, int64_t n, ReduceOp op) override {
    CHECK(n >= 0, "n = ", n);
    if (n == 0) return;
    begin("all_reduce");
    check(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32,
                        op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream_),
          "ncclAllReduce");
    wait_ready("all_reduce");
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    if (bytes == 0) return;
    begin("all_gather");
    check(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
    wait_ready("all_gather");
  }

  // One send and one receive per peer, in one group.
  void all_to_all(const void* send, void* recv, size_t bytes) override {
    if (bytes == 0) return;
    begin("all_to_all");
    const auto* s = static_cast<const uint8_t*>(send);
    auto* r = static_cast<uint8_t*>(recv);
    check(ncclGroupStart(), "ncclGroupStart");
    for (int peer = 0; peer < size_; ++peer) {
      check(ncclSend(s + peer * bytes, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
      check(ncclRecv(r + peer * bytes, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    wait_ready("all_to_all");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    CHECK(root >= 0 && root < size_, "root ", root, " of a group of ", size_);
    if (bytes == 0) return;
    begin("broadcast");
    check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    wait_ready("broadcast");
  }

  // A one-float all-reduce, then waits for the stream (so for every collective before it).
  void barrier() override {
    begin("barrier");
    check(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclFloat32, ncclSum, comm_, stream_),
          "ncclAllReduce");
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      poll_state("barrier");
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady)
        fail(str_cat("barrier: cudaStreamQuery: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                     ")"));
      if (Clock::now() >= deadline)
        fail(str_cat("barrier not done within ", timeout_.count(), " ms"));
      std::this_thread::sleep_for(kPollInterval);
    }
  }

 private:
  struct CudaFree {
    void operator()(float* p) const { cudaFree(p); }
  };

  // Flushes the communicator's work (ncclCommFinalize), up to the timeout; false when it
  // failed or did not finish (then it is to be aborted).
  bool finalize() {
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r != ncclSuccess && r != ncclInProgress) return false;
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return false;
      if (state != ncclInProgress) return state == ncclSuccess;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  void begin(const char* what) {
    if (failed_)
      throw CommError(
          str_cat("NCCL ", what, " on rank ", rank_, " of ", size_, ": the group failed earlier"));
  }

  // A call's result: ncclInProgress is its normal answer on a non-blocking communicator.
  void check(ncclResult_t result, const char* call) {
    if (result != ncclSuccess && result != ncclInProgress)
      fail(str_cat(call, ": ", ncclGetErrorString(result)));
  }

  // The communicator's state: ncclSuccess when idle, ncclInProgress while an init or an
  // enqueue is under way; anything else is an error (a peer died, a network failure).
  // Returns whether it is idle.
  bool poll_state(const char* what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(str_cat(what, ": ncclCommGetAsyncError: ", ncclGetErrorString(r)));
    if (state != ncclSuccess && state != ncclInProgress)
      fail(str_cat(what, ": ", ncclGetErrorString(state)));
    return state == ncclSuccess;
  }

  // NCCL takes the next call on a non-blocking communicator only once the last is
  // enqueued (the state back to ncclSuccess); the work itself runs on the stream.
  void wait_ready(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    while (!poll_state(what)) {
      if (Clock::now() >= deadline)
        fail(str_cat(what, " not done within ", timeout_.count(), " ms"));
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // Aborts the communicator (unblocking this rank's pending work) and throws.
  [[noreturn]] void fail(const std::string& message) {
    std::string detail;
    if (comm_ != nullptr && !failed_) {
      const char* last = ncclGetLastError(comm_);
      if (last != nullptr && *last != '\0') detail = str_cat(" (", last, ")");
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    failed_ = true;
    throw CommError(str_cat("NCCL on rank ", rank_, " of ", size_, ": ", message, detail));
  }

  int rank_;
  int size_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<float, CudaFree> scratch_;  // [1], device: the barrier's all-reduce
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Store& store, int rank, int size, int device,
                                                     cudaStream_t stream,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& prefix) {
  CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of a group of ", size);
  CHECK(timeout.count() > 0, "timeout ", timeout.count(), " ms");
  return std::make_unique<NcclCommunicator>(store, rank, size, device, stream, timeout, prefix);
}

}  // namespace hyserve::parallel
