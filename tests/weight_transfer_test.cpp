// The serving side of the weight-transfer protocol (issue 48 item 4) on the CPU: a trainer
// thread serves the rendezvous store and broadcasts tensors over Gloo as rank 0; after
// finish, the engine's outputs equal a fresh engine's on the trainer's weights, bitwise.
// Partial updates keep the other tensors (and the earlier updates'); a tensor the model
// lacks is refused naming it and nothing changes; a folder works without a group.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "checkpoint_edit.h"
#include "engine/weight_transfer.h"
#include "engine_test_helpers.h"
#include "model/checkpoint.h"
#include "parallel/make_communicator.h"

namespace hyserve {
namespace {

using namespace test;
namespace fs = std::filesystem;

fs::path tiny_dir() {
  return fs::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
}

// The tiny model with the bf16 tensors whose names contain `part` changed in one mantissa
// bit.
fs::path edited_tiny(const std::string& name, const std::string& part) {
  return rewrite_checkpoint(tiny_dir(), name, [&](std::vector<TensorToWrite>& tensors) {
    for (TensorToWrite& t : tensors) {
      if (t.dtype != DType::kBF16 || t.name.find(part) == std::string::npos) continue;
      for (size_t i = 0; i < t.bytes.size(); i += 2) t.bytes[i] ^= 0x08;
    }
  });
}

std::vector<int32_t> greedy(Engine& engine, const std::string& id) {
  const auto prompt = random_prompt(24, 77, engine.model().config().vocab_size);
  Collector c;
  Request r = make_request(id, prompt, 8);
  r.sampling_params.logprobs = 1;
  engine.add_request(std::move(r), c.callback());
  run_to_completion(engine);
  std::vector<int32_t> out;
  for (const OutputToken& t : c.results[id].tokens) {
    out.push_back(t.token);
    out.push_back(static_cast<int32_t>(std::bit_cast<uint32_t>(t.logprob)));  // bitwise
  }
  return out;
}

// The trainer: rank 0 of a group of two, serving the store; sends `names` of `source`.
class Trainer {
 public:
  Trainer() {
    parallel::TcpStoreOptions o;
    o.is_server = true;
    o.port = 0;
    store_ = std::make_unique<parallel::TcpStore>(o);
  }
  int port() const { return store_->port(); }
  // Joins while the server joins (both block until the group is formed).
  std::future<void> join() {
    return std::async(std::launch::async, [this] {
      comm_ = parallel::make_cpu_communicator(*store_, 0, 2, std::chrono::seconds(60),
                                              "weight_transfer");
    });
  }
  WeightTransferUpdate describe(const Checkpoint& source, const std::vector<std::string>& names) {
    WeightTransferUpdate u;
    for (const std::string& n : names) {
      const TensorInfo& t = *source.find(n);
      u.names.push_back(n);
      u.dtype_names.push_back(t.dtype == DType::kBF16 ? "bfloat16"
                                                      : std::string(dtype_name(t.dtype)));
      u.shapes.push_back(t.shape);
    }
    return u;
  }
  std::future<void> send(const Checkpoint& source, const std::vector<std::string>& names) {
    return std::async(std::launch::async, [this, &source, names] {
      for (const std::string& n : names) {
        const TensorInfo& t = *source.find(n);
        std::vector<uint8_t> bytes(t.data, t.data + t.num_bytes);
        comm_->broadcast(bytes.data(), bytes.size(), 0);
      }
    });
  }

 private:
  std::unique_ptr<parallel::TcpStore> store_;
  std::unique_ptr<parallel::Communicator> comm_;
};

#if HYSERVE_WITH_GLOO
#define SKIP_WITHOUT_GLOO()
#else
#define SKIP_WITHOUT_GLOO() GTEST_SKIP() << "built without Gloo"
#endif

void join(WeightTransfer& wt, Trainer& trainer) {
  std::future<void> t = trainer.join();
  WeightTransferInit init;
  init.master_port = trainer.port();
  init.timeout_s = 60;
  wt.init(init);
  t.get();
  EXPECT_TRUE(wt.initialized());
  EXPECT_EQ(wt.world_size(), 2);
}

void broadcast_update(WeightTransfer& wt, Trainer& trainer, const Checkpoint& source,
                      const std::vector<std::string>& names) {
  wt.start();
  std::future<void> sent = trainer.send(source, names);
  wt.update(trainer.describe(source, names));
  sent.get();
  EXPECT_EQ(wt.finish(), static_cast<int64_t>(names.size()));
}

TEST(WeightTransferTest, BroadcastUpdateEqualsFreshEngine) {
  SKIP_WITHOUT_GLOO();
  const fs::path next_dir = edited_tiny("wt_all", "");
  const Checkpoint next = Checkpoint::open(next_dir);
  Engine engine(load_tiny(), small_config());
  Engine fresh(Model::load(next_dir), small_config());
  const std::vector<int32_t> before = greedy(engine, "a");
  WeightTransfer wt(engine, "gloo");
  Trainer trainer;
  join(wt, trainer);
  broadcast_update(wt, trainer, next, next.names());
  EXPECT_EQ(engine.weights_generation(), 1);
  const std::vector<int32_t> after = greedy(engine, "b");
  EXPECT_EQ(after, greedy(fresh, "b"));
  EXPECT_NE(after, before);
}

// Two partial updates (the MLPs, then the attention) give the model with both edits.
TEST(WeightTransferTest, PartialUpdatesAccumulate) {
  SKIP_WITHOUT_GLOO();
  const fs::path mlp_dir = edited_tiny("wt_mlp", ".mlp.");
  const fs::path both_dir =
      rewrite_checkpoint(mlp_dir, "wt_both", [](std::vector<TensorToWrite>& ts) {
        for (TensorToWrite& t : ts) {
          if (t.dtype != DType::kBF16 || t.name.find(".self_attn.") == std::string::npos) continue;
          for (size_t i = 0; i < t.bytes.size(); i += 2) t.bytes[i] ^= 0x08;
        }
      });
  const Checkpoint both = Checkpoint::open(both_dir);
  std::vector<std::string> mlp, attn;
  for (const std::string& n : both.names()) {
    if (both.find(n)->dtype != DType::kBF16) continue;
    if (n.find(".mlp.") != std::string::npos) mlp.push_back(n);
    if (n.find(".self_attn.") != std::string::npos) attn.push_back(n);
  }
  ASSERT_FALSE(mlp.empty());
  ASSERT_FALSE(attn.empty());
  Engine engine(load_tiny(), small_config());
  Engine fresh(Model::load(both_dir), small_config());
  WeightTransfer wt(engine, "gloo");
  Trainer trainer;
  join(wt, trainer);
  broadcast_update(wt, trainer, both, mlp);
  broadcast_update(wt, trainer, both, attn);
  EXPECT_EQ(greedy(engine, "a"), greedy(fresh, "a"));
}

TEST(WeightTransferTest, UnknownTensorIsRefusedAndNothingChanges) {
  SKIP_WITHOUT_GLOO();
  Engine engine(load_tiny(), small_config());
  const std::vector<int32_t> before = greedy(engine, "a");
  WeightTransfer wt(engine, "gloo");
  Trainer trainer;
  join(wt, trainer);
  const fs::path extra =
      rewrite_checkpoint(tiny_dir(), "wt_extra", [](std::vector<TensorToWrite>& ts) {
        ts.push_back(
            {"model.layers.0.not_a_tensor.weight", DType::kBF16, {4}, std::vector<uint8_t>(8, 1)});
      });
  const Checkpoint source = Checkpoint::open(extra);
  broadcast_update(wt, trainer, source, {"language_model.model.embed_tokens.weight"});
  wt.start();
  std::future<void> sent = trainer.send(source, {"model.layers.0.not_a_tensor.weight"});
  wt.update(trainer.describe(source, {"model.layers.0.not_a_tensor.weight"}));
  sent.get();
  try {
    wt.finish();
    ADD_FAILURE() << "an unknown tensor was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not_a_tensor"), std::string::npos) << e.what();
  }
  EXPECT_EQ(engine.weights_generation(), 1);
  EXPECT_EQ(greedy(engine, "b"), before);
}

TEST(WeightTransferTest, FolderUpdateNeedsNoGroup) {
  const fs::path next_dir = edited_tiny("wt_folder", ".mlp.");
  Engine engine(load_tiny(), small_config());
  Engine fresh(Model::load(next_dir), small_config());
  WeightTransfer wt(engine, "");
  EXPECT_THROW(wt.init({}), InvalidRequest);
  EXPECT_THROW(wt.update({}), InvalidRequest) << "update before start";
  wt.start();
  WeightTransferUpdate u;
  u.weights_path = next_dir.string();
  wt.update(u);
  EXPECT_GT(wt.finish(), 0);
  EXPECT_EQ(greedy(engine, "a"), greedy(fresh, "a"));
}

TEST(WeightTransferTest, ParsesTorchAndSafetensorsDtypes) {
  EXPECT_EQ(parse_transfer_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_transfer_dtype("torch.float32"), DType::kF32);
  EXPECT_EQ(parse_transfer_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_transfer_dtype("float8_e4m3fn"), DType::kE4M3);
  EXPECT_THROW(parse_transfer_dtype("complex64"), InvalidRequest);
}

}  // namespace
}  // namespace hyserve
