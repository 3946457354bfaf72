#include "parallel/single_rank_communicator.h"

#include <cstring>

namespace hyserve::parallel {

namespace {

class SingleRankCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, int64_t n, ReduceOp) override { CHECK(n >= 0, "n = ", n); }
  void all_gather(const void* send, void* recv, size_t bytes) override { copy(send, recv, bytes); }
  void all_to_all(const void* send, void* recv, size_t bytes) override { copy(send, recv, bytes); }
  void broadcast(void*, size_t, int root) override {
    CHECK(root == 0, "root ", root, " of a group of 1");
  }
  void barrier() override {}

 private:
  static void copy(const void* send, void* recv, size_t bytes) {
    if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace hyserve::parallel
