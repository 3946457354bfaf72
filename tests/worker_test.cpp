// The Worker (engine/worker.h) on the CPU backend: the KV pool it plans for a memory budget
// (exactly the rows the given bytes hold; without one, max_num_seqs full-length requests),
// its refusal of a pool that cannot hold one request of max_model_len tokens, the engine
// config it completes, the model it loads (the logits of Model::load's), and a
// tensor-parallel group's agreement on the smallest rank's pool.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/worker.h"
#include "kv/cache_format.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/store.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

fs::path source_path(const std::string& rel) {
  return fs::path(HYSERVE_SOURCE_DIR) / rel;
}

// serve's defaults on the bundled model, with small limits.
WorkerConfig small_config(const fs::path& dir) {
  WorkerConfig c;
  c.model_dir = dir;
  c.device = "cpu";
  c.model.indexer_fp8 = true;
  c.engine.scheduler.max_model_len = 256;
  c.engine.scheduler.max_num_seqs = 4;
  c.engine.scheduler.max_num_batched_tokens = 64;
  c.engine.enable_prefix_caching = true;
  return c;
}

// The model as serve's flags would load it, without a worker.
std::unique_ptr<Model> load_directly(const WorkerConfig& c) {
  ModelOptions o = c.model;
  o.latent_cache =
      resolve_latent_cache_dtype(c.kv_cache_dtype, ModelConfig::load(c.model_dir).cache_spec());
  return Model::load(c.model_dir, o);
}

TEST(Worker, PoolHoldsTheWholeRowsOfTheGivenBytes) {
  WorkerConfig c = small_config(source_path("models/tiny-kimi-k3"));
  const CachePlan plan = load_directly(c)->cache_plan(c.engine.min_block_size);
  ASSERT_GT(plan.row_bytes, 0);
  c.kv_cache_memory_bytes = 23 * plan.row_bytes + plan.row_bytes / 2;
  const Worker worker(c);
  EXPECT_EQ(worker.cache_plan().row_bytes, plan.row_bytes);
  EXPECT_EQ(worker.memory_plan().num_blocks, 23);
  EXPECT_EQ(worker.engine_config().num_blocks, 23);
  // The rest of the engine's config: the warm-up's workspace, no graphs on the CPU, the
  // model's vocabulary, the limits as given.
  const EngineConfig& ec = worker.engine_config();
  EXPECT_GT(ec.workspace_bytes, 0u);
  EXPECT_EQ(ec.decode_graph_max_batch, 0);
  EXPECT_EQ(ec.scheduler.vocab_size, worker.model().config().vocab_size);
  EXPECT_EQ(ec.scheduler.max_model_len, 256);
  EXPECT_EQ(ec.scheduler.max_num_seqs, 4);
  EXPECT_TRUE(ec.enable_prefix_caching);
}

TEST(Worker, PoolOnTheCpuHoldsMaxNumSeqsFullRequests) {
  const WorkerConfig c = small_config(source_path("models/tiny-kimi-k3"));
  const Worker worker(c);
  const CachePlan& plan = worker.cache_plan();
  const int64_t per_request = plan.blocks_for_tokens(256) + plan.kda_state_rows;
  EXPECT_EQ(worker.memory_plan().blocks_per_request, per_request);
  EXPECT_EQ(worker.engine_config().num_blocks, 4 * per_request);
}

TEST(Worker, RefusesAPoolThatCannotHoldOneFullLengthRequest) {
  WorkerConfig c = small_config(source_path("models/tiny-kimi-k3"));
  const CachePlan plan = load_directly(c)->cache_plan(c.engine.min_block_size);
  const int64_t per_request = plan.blocks_for_tokens(256) + plan.kda_state_rows;
  ASSERT_GT(per_request, 1);
  c.kv_cache_memory_bytes = (per_request - 1) * plan.row_bytes;
  try {
    const Worker worker(c);
    FAIL() << "a pool of " << per_request - 1 << " blocks was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(str_cat(per_request - 1, " blocks of ", plan.row_bytes, " bytes; one ",
                                "request of max_model_len 256 tokens needs ", per_request,
                                ": lower --max-model-len or give the cache more memory")),
              std::string::npos)
        << what;
  }
  // The same budget holds a request of a shorter context.
  c.engine.scheduler.max_model_len = 64;
  const Worker shorter(c);
  EXPECT_EQ(shorter.engine_config().num_blocks, per_request - 1);
}

TEST(Worker, ModelGivesTheLogitsOfModelLoad) {
  const WorkerConfig c = small_config(source_path("models/tiny-kimi-k3"));
  Worker worker(c);
  const std::unique_ptr<Model> direct = load_directly(c);
  EXPECT_EQ(worker.model().options().latent_cache, direct->options().latent_cache);
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 7, 250, 11, 5};
  const auto logits = [&](const Model& m) {
    SequenceState s = m.new_sequence();
    std::vector<float> out;
    m.forward(prompt, s, out);
    return out;
  };
  const std::vector<float> expected = logits(*direct);
  EXPECT_EQ(logits(worker.model()), expected);
  // Released to an engine, the same model.
  const std::unique_ptr<Model> released = worker.release_model();
  EXPECT_EQ(logits(*released), expected);
  EXPECT_THROW(worker.model(), Error);
}

#if HYSERVE_WITH_GLOO
// Two ranks (threads, Gloo over one store), rank 1 with a smaller budget: both run rank 1's
// pool, and each keeps its own plan.
TEST(Worker, GroupAgreesOnTheSmallestRanksPool) {
  const WorkerConfig c = small_config(source_path("tests/fixtures/kimi_linear_tiny"));
  parallel::HashStore store;
  std::vector<int64_t> own(2, -1), agreed(2, -1);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        WorkerConfig rc = c;
        rc.kv_cache_memory_bytes = rank == 0 ? int64_t{8} << 20 : int64_t{6} << 20;
        WorkerGroup g;
        g.rank = rank;
        g.size = 2;
        g.store = &store;
        g.timeout = std::chrono::seconds(30);
        const Worker worker(rc, g);
        EXPECT_EQ(worker.model().options().parallel.tp.size, 2);
        own[static_cast<size_t>(rank)] = worker.memory_plan().num_blocks;
        agreed[static_cast<size_t>(rank)] = worker.engine_config().num_blocks;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << " / " << errors[1];
  EXPECT_LT(own[1], own[0]);
  EXPECT_EQ(agreed[0], own[1]);
  EXPECT_EQ(agreed[1], own[1]);
}
#endif

}  // namespace
}  // namespace hyserve
