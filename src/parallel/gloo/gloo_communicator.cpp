#include "parallel/gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cctype>
#include <optional>

#include "parallel/single_rank_communicator.h"

namespace hyserve::parallel {

namespace {

// Gloo's rendezvous store over ours: keys under prefix/, and our timeout where Gloo gives
// none.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(parallel::Store& store, const std::string& prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(prefix + "/"), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes v = store_.get(prefix_ + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    for (const auto& k : keys) prefixed.push_back(prefix_ + k);
    store_.wait(prefixed, timeout == gloo::kNoTimeout ? timeout_ : timeout);
  }

 private:
  parallel::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// The first "rank N" in a Gloo message whose N is not this rank (Gloo names peers so:
// "... between rank 0 (this process) and rank 2").
std::optional<int> peer_rank_in(const std::string& message, int own_rank) {
  const std::string word = "rank ";
  for (size_t pos = message.find(word); pos != std::string::npos;
       pos = message.find(word, pos + 1)) {
    size_t end = pos + word.size();
    int n = 0;
    bool any = false;
    for (; end < message.size() && std::isdigit(static_cast<unsigned char>(message[end])); ++end) {
      n = n * 10 + (message[end] - '0');
      any = true;
    }
    if (any && n != own_rank) return n;
  }
  return std::nullopt;
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(parallel::Store& store, int rank, int size, std::chrono::milliseconds timeout,
                   const std::string& prefix)
      : rank_(rank), size_(size) {
    run("rendezvous", [&] {
      gloo::transport::tcp::attr attr("127.0.0.1");
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(timeout);
      GlooStore gloo_store(store, prefix, timeout);
      context->connectFullMesh(gloo_store, device);
      context_ = std::move(context);
    });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* data, int64_t n, ReduceOp op) override {
    CHECK(n >= 0, "n = ", n);
    if (n == 0) return;
    run("all_reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, static_cast<size_t>(n));
      opts.setReduceFunction(op == ReduceOp::kSum ? static_cast<ReduceFn>(&gloo::sum<float>)
                                                  : static_cast<ReduceFn>(&gloo::max<float>));
      gloo::allreduce(opts);
    });
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    if (bytes == 0) return;
    run("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes);
      opts.setOutput(static_cast<uint8_t*>(recv), bytes * size_);
      gloo::allgather(opts);
    });
  }

  void all_to_all(const void* send, void* recv, size_t bytes) override {
    if (bytes == 0) return;
    run("all_to_all", [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes * size_);
      opts.setOutput(static_cast<uint8_t*>(recv), bytes * size_);
      gloo::alltoall(opts);
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    CHECK(root >= 0 && root < size_, "root ", root, " of a group of ", size_);
    if (bytes == 0) return;
    run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      gloo::barrier(opts);
    });
  }

 private:
  // Runs one Gloo call, turning its errors (and the store's, in the rendezvous) into
  // CommError; a failed group stays failed.
  template <typename F>
  void run(const char* what, F&& f) {
    if (failed_)
      throw CommError(
          str_cat("gloo ", what, " on rank ", rank_, " of ", size_, ": the group failed earlier"));
    try {
      f();
      return;
    } catch (const CommError& e) {
      fail(what, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      fail(what, e.what());
    } catch (const gloo::Exception& e) {  // IoException among them
      fail(what, e.what());
    }
  }

  [[noreturn]] void fail(const char* what, const std::string& message) {
    failed_ = true;
    const auto peer = peer_rank_in(message, rank_);
    throw CommError(str_cat("gloo ", what, " failed on rank ", rank_, " of ", size_,
                            peer ? str_cat(" (peer rank ", *peer, ")") : std::string(), ": ",
                            message));
  }

  int rank_;
  int size_;
  bool failed_ = false;
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(Store& store, int rank, int size,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& prefix) {
  CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of a group of ", size);
  CHECK(timeout.count() > 0, "timeout ", timeout.count(), " ms");
  if (size == 1) return make_single_rank_communicator();
  return std::make_unique<GlooCommunicator>(store, rank, size, timeout, prefix);
}

}  // namespace hyserve::parallel
