// Tensor-parallel tests' ranks as threads of this process: fn(rank, comm) on each of tp
// threads, with the rank's CPU communicator of one group over an in-process store.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/make_communicator.h"
#include "parallel/store.h"

namespace hyserve::test {

// Runs fn(rank, comm) on tp threads and joins them; a rank that throws fails the test with its
// message, naming the rank.
template <class Fn>
void on_ranks(int tp, Fn fn) {
  using namespace std::chrono_literals;
  parallel::HashStore store;
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::unique_ptr<parallel::Communicator> comm =
            parallel::make_cpu_communicator(store, rank, tp, 60s, "tp");
        fn(rank, comm.get());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < tp; ++rank) {
    EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << "rank " << rank;
  }
}

}  // namespace hyserve::test
