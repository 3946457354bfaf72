// Store: the key-value store a group of ranks meets through before it has a communicator
// (rendezvous): Gloo's peers exchange their addresses through it, NCCL's ranks the
// ncclUniqueId. TcpStore serves the store from rank 0 to the other processes over TCP
// (Boost.Asio); HashStore holds it in memory for ranks that are threads of one process.
//
// Every blocking operation has a timeout and throws CommError when it passes, so a rank
// whose peer died never waits forever.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace hyserve::parallel {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  // Sets (or replaces) key's value; wakes the ranks waiting for it.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // key's value, once some rank has set it; CommError naming the key and the timeout when
  // none has within it.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds delta to key's value, a decimal integer (a missing key counts as 0), and returns
  // the new value. get() on the key returns it as decimal text.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Returns once every key is set; CommError as get() when one is not within the timeout
  // (one timeout for them all).
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
};

// In memory, for threads of one process.
class HashStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
};

struct TcpStoreOptions {
  // The server's address: rank 0 listens on it, the others connect to it. A server on
  // 0.0.0.0 (any address) reaches itself through 127.0.0.1.
  std::string host = "127.0.0.1";
  int port = 0;  // 0 on the server: a free port, see TcpStore::port()
  bool is_server = false;
  // Clients retry connecting until this passes (the server may start after them).
  std::chrono::milliseconds connect_timeout{30000};
  // For set() and add(), which wait only for the server's answer.
  std::chrono::milliseconds timeout{30000};
};

class StoreServer;
class StoreClient;

// The server (is_server: rank 0) keeps the values on a thread of its own and is also a
// client of itself, so every rank's operations take the same path.
class TcpStore : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

  // The port the server listens on (the one chosen when options.port was 0).
  int port() const { return port_; }

 private:
  TcpStoreOptions options_;
  int port_;
  std::unique_ptr<StoreServer> server_;  // is_server only
  std::unique_ptr<StoreClient> client_;  // after server_: closed before it stops
};

// Decimal text of an add() value, and back; CommError naming the key when value is not an
// integer.
Bytes encode_counter(int64_t value);
int64_t decode_counter(const std::string& key, const Bytes& value);

}  // namespace hyserve::parallel
