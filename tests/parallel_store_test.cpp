// TcpStore and HashStore: values set by one rank are seen by all, get() waits for a key and
// times out naming it, add() counts across ranks, and a client of a closed port gives up
// within its connect timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "parallel/store.h"

namespace hyserve::parallel {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Bytes bytes_of(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string string_of(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

TcpStoreOptions client_options(int port) {
  TcpStoreOptions o;
  o.port = port;
  o.connect_timeout = 5s;
  return o;
}

TEST(TcpStore, ServerAndThreeClientsSetGetAdd) {
  TcpStoreOptions server_options;
  server_options.is_server = true;
  TcpStore server(server_options);
  ASSERT_GT(server.port(), 0);
  constexpr int kNumClients = 3;
  std::vector<int64_t> last_add(kNumClients);
  std::vector<std::string> seen(kNumClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kNumClients; ++c) {
    threads.emplace_back([&, c] {
      TcpStore client(client_options(server.port()));
      client.set("from/" + std::to_string(c), bytes_of("client " + std::to_string(c)));
      // Waits for the server's key, set after every client has added.
      last_add[c] = client.add("count", 1);
      seen[c] = string_of(client.get("go", 5s));
      for (int other = 0; other < kNumClients; ++other)
        EXPECT_EQ(string_of(client.get("from/" + std::to_string(other), 5s)),
                  "client " + std::to_string(other));
    });
  }
  while (server.add("count", 0) < kNumClients) std::this_thread::sleep_for(1ms);
  server.set("go", bytes_of("now"));
  for (auto& t : threads) t.join();
  for (int c = 0; c < kNumClients; ++c) EXPECT_EQ(seen[c], "now");
  std::vector<int64_t> sorted = last_add;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(string_of(server.get("count", 1s)), "3");
  EXPECT_EQ(server.add("count", -5), -2);
  server.set("count", bytes_of("replaced"));
  EXPECT_EQ(string_of(server.get("count", 1s)), "replaced");
  EXPECT_THROW(server.add("count", 1), CommError);
  server.set("empty", {});
  EXPECT_TRUE(server.get("empty", 1s).empty());
  server.wait({"go", "empty", "from/0"}, 1s);
}

TEST(TcpStore, GetTimesOutNamingTheKey) {
  TcpStoreOptions server_options;
  server_options.is_server = true;
  TcpStore server(server_options);
  TcpStore client(client_options(server.port()));
  const auto start = Clock::now();
  try {
    client.get("never/set", 200ms);
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'never/set'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("200 ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 2s);
  // The client is usable afterwards (on a new connection).
  server.set("later", bytes_of("x"));
  EXPECT_EQ(string_of(client.get("later", 1s)), "x");
  EXPECT_THROW(client.wait({"later", "never/set"}, 100ms), CommError);
}

TEST(TcpStore, ConnectToAClosedPortThrowsWithinTheTimeout) {
  int port = 0;
  {  // a port that was free a moment ago, and nobody listens on now
    TcpStoreOptions server_options;
    server_options.is_server = true;
    port = TcpStore(server_options).port();
  }
  TcpStoreOptions o = client_options(port);
  o.connect_timeout = 300ms;
  const auto start = Clock::now();
  try {
    TcpStore client(o);
    FAIL() << "connected to a closed port";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 250ms);
  EXPECT_LT(elapsed, 3s);
}

TEST(TcpStore, ClientOfAServerThatStoppedThrows) {
  TcpStoreOptions server_options;
  server_options.is_server = true;
  auto server = std::make_unique<TcpStore>(server_options);
  TcpStoreOptions o = client_options(server->port());
  o.connect_timeout = 300ms;
  TcpStore client(o);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  const auto start = Clock::now();
  EXPECT_THROW(client.get("never/set", 10s), CommError);
  EXPECT_LT(Clock::now() - start, 5s);
  stopper.join();
  EXPECT_THROW(client.set("k", {}), CommError);  // cannot reconnect either
}

TEST(HashStore, SetGetAddAcrossThreads) {
  HashStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&store] {
      store.add("count", 2);
      EXPECT_EQ(string_of(store.get("go", 5s)), "now");
    });
  while (store.add("count", 0) < 8) std::this_thread::sleep_for(1ms);
  store.set("go", bytes_of("now"));
  for (auto& t : threads) t.join();
  EXPECT_EQ(string_of(store.get("count", 0ms)), "8");
  try {
    store.get("missing", 50ms);
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyserve::parallel
