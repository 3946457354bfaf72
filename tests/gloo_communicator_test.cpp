// The Gloo communicator with ranks as threads of this process, over a HashStore and over a
// TcpStore: every collective against what the math says, exactly (integer-valued floats
// sum exactly in any order).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/make_communicator.h"
#include "parallel/store.h"
#if HYSERVE_WITH_GLOO
#include "parallel/gloo/gloo_communicator.h"
#endif

namespace hyserve::parallel {
namespace {

using namespace std::chrono_literals;

// Every rank's part of the checks, run by each thread on its communicator.
void check_collectives(Communicator& comm, std::atomic<int>& arrived) {
  const int rank = comm.rank();
  const int size = comm.size();

  constexpr int64_t kN = 70000;  // more than one of Gloo's segments
  std::vector<float> sum(kN);
  for (int64_t i = 0; i < kN; ++i) sum[i] = static_cast<float>(rank * 100 + i % 1000);
  comm.all_reduce(sum.data(), kN, ReduceOp::kSum);
  for (int64_t i = 0; i < kN; ++i)
    ASSERT_EQ(sum[i], static_cast<float>(100 * size * (size - 1) / 2 + size * (i % 1000))) << i;

  std::vector<float> max(257);
  for (size_t i = 0; i < max.size(); ++i) max[i] = static_cast<float>((i * 7 + rank * 13) % 101);
  comm.all_reduce(max.data(), static_cast<int64_t>(max.size()), ReduceOp::kMax);
  for (size_t i = 0; i < max.size(); ++i) {
    int expected = 0;
    for (int r = 0; r < size; ++r) expected = std::max<int>(expected, (i * 7 + r * 13) % 101);
    ASSERT_EQ(max[i], static_cast<float>(expected)) << i;
  }

  constexpr size_t kBlock = 24;
  std::vector<uint8_t> send(kBlock);
  for (size_t j = 0; j < kBlock; ++j) send[j] = static_cast<uint8_t>(rank * 31 + j);
  std::vector<uint8_t> gathered(kBlock * size);
  comm.all_gather(send.data(), gathered.data(), kBlock);
  for (int r = 0; r < size; ++r)
    for (size_t j = 0; j < kBlock; ++j)
      ASSERT_EQ(gathered[r * kBlock + j], static_cast<uint8_t>(r * 31 + j)) << r << " " << j;

  // Block i of send goes to rank i: rank r's block i holds r * 1000 + i * 10 + j.
  constexpr size_t kInts = 5;
  std::vector<int32_t> to_all(kInts * size), from_all(kInts * size, -1);
  for (int i = 0; i < size; ++i)
    for (size_t j = 0; j < kInts; ++j) to_all[i * kInts + j] = rank * 1000 + i * 10 + j;
  comm.all_to_all(to_all.data(), from_all.data(), kInts * sizeof(int32_t));
  for (int r = 0; r < size; ++r)
    for (size_t j = 0; j < kInts; ++j)
      ASSERT_EQ(from_all[r * kInts + j], static_cast<int32_t>(r * 1000 + rank * 10 + j));

  const int root = size - 1;
  std::vector<int32_t> data(100, rank == root ? 0 : -1);
  if (rank == root)
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int32_t>(i * i);
  comm.broadcast(data.data(), data.size() * sizeof(int32_t), root);
  for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<int32_t>(i * i));

  arrived.fetch_add(1);
  comm.barrier();
  EXPECT_EQ(arrived.load(), size);
  comm.barrier();  // nobody runs on (and resets arrived) before all have checked it
}

enum class StoreKind { kHash, kTcp };

// Runs size ranks as threads, each with its own communicator.
void run_group(int size, StoreKind kind) {
  std::vector<std::unique_ptr<Store>> stores;
  if (kind == StoreKind::kHash) {
    stores.push_back(std::make_unique<HashStore>());  // one for all ranks
  } else {
    TcpStoreOptions server;
    server.is_server = true;
    stores.push_back(std::make_unique<TcpStore>(server));
    const int port = static_cast<TcpStore&>(*stores[0]).port();
    for (int r = 1; r < size; ++r) {
      TcpStoreOptions client;
      client.port = port;
      client.connect_timeout = 5s;
      stores.push_back(std::make_unique<TcpStore>(client));
    }
  }
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    Store& store = kind == StoreKind::kHash ? *stores[0] : *stores[r];
    threads.emplace_back([&, r] {
      auto comm = make_cpu_communicator(store, r, size, 5s, "test");
      EXPECT_EQ(comm->rank(), r);
      EXPECT_EQ(comm->size(), size);
      check_collectives(*comm, arrived);
    });
  }
  for (auto& t : threads) t.join();
}

#if HYSERVE_WITH_GLOO

TEST(GlooCommunicator, TwoRanksOverHashStore) {
  run_group(2, StoreKind::kHash);
}
TEST(GlooCommunicator, FourRanksOverHashStore) {
  run_group(4, StoreKind::kHash);
}
TEST(GlooCommunicator, TwoRanksOverTcpStore) {
  run_group(2, StoreKind::kTcp);
}
TEST(GlooCommunicator, FourRanksOverTcpStore) {
  run_group(4, StoreKind::kTcp);
}

TEST(GlooCommunicator, RankThatNeverJoinsTimesOutNamingTheRank) {
  HashStore store;
  const auto start = std::chrono::steady_clock::now();
  try {
    make_gloo_communicator(store, 0, 2, 300ms, "alone");
    FAIL() << "rendezvous without the peer returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

#else

TEST(GlooCommunicator, WithoutGlooAGroupOfTwoIsRefused) {
  HashStore store;
  EXPECT_THROW(make_cpu_communicator(store, 0, 2, 1s, "test"), CommError);
}

#endif

// Size 1 makes no Gloo calls (and needs no Gloo).
TEST(GlooCommunicator, SizeOne) {
  run_group(1, StoreKind::kHash);
}

}  // namespace
}  // namespace hyserve::parallel
