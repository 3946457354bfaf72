// Tensor parallelism on the CPU backend: weight shards decode to exactly the slices of the
// full matrices (the vocabulary shards of embed_tokens and lm_head too, whether or not the
// group size divides the vocabulary), and a model split over 2 or 4 ranks (threads, Gloo
// collectives) gives the logits of the whole model within float summation-order error, the
// same bits on every rank.
#include "model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "model/weight_bytes.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"
#include "tp_test_util.h"

namespace hyserve {
namespace {

using namespace std::chrono_literals;

std::filesystem::path source_path(const std::string& rel) {
  return std::filesystem::path(HYSERVE_SOURCE_DIR) / rel;
}

std::vector<float> row_of(const Weight& w, int64_t r) {
  std::vector<float> out(static_cast<size_t>(w.cols));
  w.dequantize_row(r, out.data());
  return out;
}

// Every rank's row and column shard of w against the slices of w's decoded rows.
void expect_shards_match(const Weight& w, int size) {
  for (int rank = 0; rank < size; ++rank) {
    const Weight rows = row_shard(w, rank, size, "w");
    ASSERT_EQ(rows.rows, w.rows / size);
    ASSERT_EQ(rows.cols, w.cols);
    rows.check_layout();
    for (int64_t r = 0; r < rows.rows; ++r) {
      ASSERT_EQ(row_of(rows, r), row_of(w, rank * rows.rows + r)) << rank << " row " << r;
    }
    std::deque<std::vector<uint8_t>> owned;
    const Weight cols = col_shard(w, rank, size, owned, "w");
    ASSERT_EQ(cols.rows, w.rows);
    ASSERT_EQ(cols.cols, w.cols / size);
    cols.check_layout();
    for (int64_t r = 0; r < w.rows; ++r) {
      const std::vector<float> full = row_of(w, r);
      const std::vector<float> part = row_of(cols, r);
      const std::vector<float> want(full.begin() + rank * cols.cols,
                                    full.begin() + (rank + 1) * cols.cols);
      ASSERT_EQ(part, want) << rank << " row " << r;
    }
  }
}

std::vector<uint8_t> bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 7);
  return b;
}

TEST(TensorParallel, DenseShardsAreSlices) {
  std::vector<uint16_t> data(8 * 12);
  for (size_t i = 0; i < data.size(); ++i) data[i] = f32_to_bf16(static_cast<float>(i) - 40.0f);
  Weight w;
  w.dtype = DType::kBF16;
  w.rows = 8;
  w.cols = 12;
  w.data = data.data();
  expect_shards_match(w, 2);
  expect_shards_match(w, 4);
}

TEST(TensorParallel, Fp8ShardsKeepWholeScaleBlocks) {
  // [256, 512] e4m3 with [2, 4] fp32 block scales: rows split in 128s, columns in 128s.
  const std::vector<uint8_t> codes = [] {
    std::vector<uint8_t> c = bytes(256 * 512, 3);
    for (uint8_t& b : c) b &= 0x77;  // finite e4m3 codes, no NaN
    return c;
  }();
  const std::vector<float> scales = {0.5f, 1.0f, 2.0f, 0.25f, 4.0f, 0.125f, 1.5f, 3.0f};
  Weight w;
  w.format = WeightFormat::kFp8Block;
  w.dtype = DType::kE4M3;
  w.rows = 256;
  w.cols = 512;
  w.data = codes.data();
  w.scales = scales.data();
  w.scales_dtype = DType::kF32;
  expect_shards_match(w, 2);
  std::deque<std::vector<uint8_t>> owned;
  // 4 ranks: 64 rows each, inside one 128-row scale block.
  try {
    row_shard(w, 0, 4, "layer 3 q_b_proj");
    FAIL() << "64-row FP8 shards accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 3 q_b_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(col_shard(w, 1, 4, owned, "o_proj"));  // 128 columns a rank
  EXPECT_THROW(col_shard(w, 1, 8, owned, "o_proj"), CheckpointError);
}

TEST(TensorParallel, Mxfp4AndInt4ShardsKeepWholeGroups) {
  const std::vector<uint8_t> codes = bytes(6 * 128 / 2, 11);
  std::vector<uint8_t> e8m0(6 * 4);
  for (size_t i = 0; i < e8m0.size(); ++i) e8m0[i] = static_cast<uint8_t>(120 + i % 9);
  Weight mx;
  mx.format = WeightFormat::kMxfp4;
  mx.dtype = DType::kU8;
  mx.rows = 6;
  mx.cols = 128;
  mx.data = codes.data();
  mx.scales = e8m0.data();
  mx.scales_dtype = DType::kE8M0;
  expect_shards_match(mx, 2);
  std::deque<std::vector<uint8_t>> owned;
  try {
    col_shard(mx, 0, 8, owned, "layer 1 experts.0.down_proj");
    FAIL() << "16-column MXFP4 shards accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 experts.0.down_proj"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
  }

  std::vector<uint16_t> bf16_scales(8 * 4);
  for (size_t i = 0; i < bf16_scales.size(); ++i)
    bf16_scales[i] = f32_to_bf16(0.01f * static_cast<float>(i + 1));
  const std::vector<uint8_t> int4_codes = bytes(8 * 128 / 2, 5);
  Weight q;
  q.format = WeightFormat::kInt4;
  q.dtype = DType::kU8;
  q.rows = 8;
  q.cols = 128;
  q.data = int4_codes.data();
  q.scales = bf16_scales.data();
  q.scales_dtype = DType::kBF16;
  expect_shards_match(q, 2);
  expect_shards_match(q, 4);
}

TEST(TensorParallel, ShardConfigDividesHeadsAndWidthsOrNamesTheField) {
  const ModelConfig full = ModelConfig::load(source_path("tests/fixtures/kimi_linear_tiny"));
  const ModelConfig half = shard_config(full, 2);
  EXPECT_EQ(half.num_attention_heads * 2, full.num_attention_heads);
  EXPECT_EQ(half.linear_num_heads * 2, full.linear_num_heads);
  EXPECT_EQ(half.moe_intermediate_size * 2, full.moe_intermediate_size);
  EXPECT_EQ(half.intermediate_size * 2, full.intermediate_size);
  EXPECT_EQ(half.hidden_size, full.hidden_size);
  EXPECT_EQ(half.kv_lora_rank, full.kv_lora_rank);
  try {
    shard_config(full, 3);
    FAIL() << "tp 3 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by the tensor-parallel size 3"),
              std::string::npos)
        << e.what();
  }
}

// Runs `make(rank, options)`'s model on tp ranks (threads), all positions of one prompt;
// returns every rank's logits.
template <class Make>
std::vector<std::vector<float>> run_ranks(int tp, bool batch_invariant, Make make,
                                          const std::vector<int32_t>& prompt) {
  std::vector<std::vector<float>> logits(static_cast<size_t>(tp));
  test::on_ranks(tp, [&](int rank, parallel::Communicator* comm) {
    ModelOptions o;
    o.batch_invariant = batch_invariant;
    o.parallel.tp = {rank, tp, comm};
    std::unique_ptr<Model> model = make(o);
    SequenceState s = model->new_sequence();
    model->forward(prompt, s, logits[rank], true);
    // A decode step after the prompt: the KDA state and cache of each rank's share.
    std::vector<float> next;
    model->forward(std::vector<int32_t>{prompt[1]}, s, next, false);
    logits[rank].insert(logits[rank].end(), next.begin(), next.end());
  });
  return logits;
}

std::vector<int32_t> prompt_for(const ModelConfig& c) {
  std::vector<int32_t> p;
  for (int i = 0; i < 21; ++i) p.push_back((i * 37 + 5) % static_cast<int32_t>(c.vocab_size));
  return p;
}

// TP logits against the whole model's: every rank the same bits; within tol of TP 1
// (partial sums add in another order), relative to the largest logit.
void expect_tp_matches(const std::vector<float>& whole,
                       const std::vector<std::vector<float>>& ranks, double tol) {
  ASSERT_FALSE(ranks.empty());
  ASSERT_EQ(ranks[0].size(), whole.size());
  for (size_t r = 1; r < ranks.size(); ++r) {
    ASSERT_EQ(ranks[r].size(), whole.size());
    EXPECT_EQ(0, std::memcmp(ranks[r].data(), ranks[0].data(), whole.size() * 4)) << "rank " << r;
  }
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(whole[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(whole[i]) - ranks[0][i]));
  }
  EXPECT_LE(max_diff, tol * max_abs) << "max |logit| " << max_abs;
  EXPECT_GT(max_abs, 0.0);
}

struct TpCase {
  const char* dir;
  std::vector<int> sizes;  // the group sizes its heads and widths divide by
};

class TensorParallelModel : public testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelModel, LogitsMatchTheWholeModelOnEveryRank) {
  const std::filesystem::path dir = source_path(GetParam().dir);
  const ModelConfig c = ModelConfig::load(dir);
  const std::vector<int32_t> prompt = prompt_for(c);
  const auto make = [&](const ModelOptions& o) { return Model::load(dir, o); };
  const std::vector<float> whole = run_ranks(1, false, make, prompt)[0];
  for (const int tp : GetParam().sizes) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    expect_tp_matches(whole, run_ranks(tp, false, make, prompt), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TensorParallelModel,
                         testing::Values(TpCase{"tests/fixtures/kimi_linear_tiny", {2}},
                                         TpCase{"tests/fixtures/deepseek_v32_tiny", {2, 4}}),
                         [](const testing::TestParamInfo<TpCase>& p) {
                           return std::filesystem::path(p.param.dir).filename().string();
                         });

// kimi_k3 (KDA, gated MLA, the latent MoE with MXFP4 experts and shared experts, AttnRes):
// the bundled config with experts wide enough for whole MXFP4 groups per rank.
TEST(TensorParallel, KimiK3LatentMoeMatchesTheWholeModel) {
  ModelConfig c = ModelConfig::load(source_path("models/tiny-kimi-k3"));
  c.moe_intermediate_size = 64;
  ASSERT_EQ(c.expert_format, ExpertFormat::kMxfp4);
  ASSERT_GT(c.moe_latent_size, 0);
  const std::vector<int32_t> prompt = prompt_for(c);
  const auto make = [&](const ModelOptions& o) {
    return Model::create(c, std::make_unique<RandomWeights>(c, 9), o);
  };
  const std::vector<float> whole = run_ranks(1, false, make, prompt)[0];
  expect_tp_matches(whole, run_ranks(2, false, make, prompt), 1e-4);
  // Batch-invariant: the partial sums added in rank order, the same bits every run.
  const std::vector<std::vector<float>> a = run_ranks(2, true, make, prompt);
  const std::vector<std::vector<float>> b = run_ranks(2, true, make, prompt);
  EXPECT_EQ(a[0], b[0]);
  expect_tp_matches(whole, a, 1e-4);
}

TEST(TensorParallel, VocabShardsCoverTheVocabularyOnce) {
  for (const int64_t vocab : {1024, 1001, 7}) {
    for (const int size : {1, 2, 3, 4}) {
      const int64_t stride = (vocab + size - 1) / size;
      int64_t next = 0;
      for (int rank = 0; rank < size; ++rank) {
        const VocabShard v = vocab_shard(vocab, rank, size);
        EXPECT_EQ(v.stride, stride);
        EXPECT_EQ(v.first, next);
        EXPECT_EQ(v.rows, rank + 1 < size ? stride : vocab - stride * rank) << vocab << "/" << size;
        next += v.rows;
      }
      EXPECT_EQ(next, vocab);
    }
  }
  // 5 rows over 4 ranks: shares of 2 leave the last rank none.
  ModelConfig c = ModelConfig::load(source_path("tests/fixtures/deepseek_v32_tiny"));
  c.vocab_size = 5;
  try {
    shard_config(c, 4);
    FAIL() << "vocab 5 over 4 ranks accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size = 5"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(shard_config(c, 2));
}

TEST(TensorParallel, Fp8VocabShardsKeepWholeScaleBlocks) {
  // [382, 128] e4m3, [3, 1] block scales, the last block 126 rows: over 3 ranks shares of
  // 128 rows (the last 126) are views on whole blocks; over 2 (191 rows) refused by name.
  const int64_t vocab = 382;
  const std::vector<uint8_t> codes = [] {
    std::vector<uint8_t> c = bytes(382 * 128, 9);
    for (uint8_t& b : c) b &= 0x77;
    return c;
  }();
  const std::vector<float> scales = {0.5f, 2.0f, 0.25f};
  Weight w;
  w.format = WeightFormat::kFp8Block;
  w.dtype = DType::kE4M3;
  w.rows = vocab;
  w.cols = 128;
  w.data = codes.data();
  w.scales = scales.data();
  w.scales_dtype = DType::kF32;
  for (int rank = 0; rank < 3; ++rank) {
    const VocabShard v = vocab_shard(vocab, rank, 3);
    const Weight part = vocab_rows(w, v, "lm_head");
    ASSERT_EQ(part.rows, v.rows);
    part.check_layout();
    for (int64_t r = 0; r < part.rows; ++r) {
      ASSERT_EQ(row_of(part, r), row_of(w, v.first + r)) << rank << " row " << r;
    }
  }
  try {
    vocab_rows(w, vocab_shard(vocab, 1, 2), "language_model.lm_head");
    FAIL() << "191-row FP8 vocabulary shares accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("language_model.lm_head"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos) << e.what();
  }
}

// deepseek_v32_tiny (heads and widths split over 2 and 4) with random bf16 weights and a
// vocabulary of 1001 rows, which neither group size divides (shares of 501 / 251 rows).
ModelConfig odd_vocab_config(bool tied) {
  ModelConfig c = ModelConfig::load(source_path("tests/fixtures/deepseek_v32_tiny"));
  c.vocab_size = 1001;
  c.tie_word_embeddings = tied;
  return c;
}

// The prompt_for ids and the first and last id of every rank's share at TP 2 and TP 4.
std::vector<int32_t> odd_vocab_prompt(const ModelConfig& c) {
  std::vector<int32_t> p = prompt_for(c);
  p.insert(p.begin() + 2, {0, 250, 251, 500, 501, 502, 752, 753, 1000});
  return p;
}

TEST(TensorParallel, VocabShardsHoldTheirRowsAndOneNthOfTheBytes) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ModelConfig c = odd_vocab_config(tied);
    const RandomWeights source(c, 4);
    const LoadedWeights whole = load_weights(c, source);
    const int64_t whole_bytes =
        whole.views.embed.storage_bytes() + (tied ? 0 : whole.views.lm_head.storage_bytes());
    const int64_t row_bytes = (tied ? 1 : 2) * c.hidden_size * 2;  // one vocabulary row
    ASSERT_EQ(whole_bytes, c.vocab_size * row_bytes);
    // The memory plan's embedding + lm_head (what a vocabulary of 0 takes away).
    ModelConfig no_vocab = c;
    no_vocab.vocab_size = 0;
    for (const int size : {2, 4}) {
      const int64_t planned = estimate_weight_bytes_per_gpu(c, size).sharded -
                              estimate_weight_bytes_per_gpu(no_vocab, size).sharded;
      int64_t sum_bytes = 0;
      for (int rank = 0; rank < size; ++rank) {
        const RandomWeights rank_source(c, 4);  // the same tensors as `source` gave
        LoadedWeights w = load_weights(c, rank_source);
        shard_weights(c, rank, size, w);
        const VocabShard v = vocab_shard(c.vocab_size, rank, size);
        const ModelWeights& m = w.views;
        ASSERT_EQ(m.embed.rows, v.rows);
        ASSERT_EQ(m.lm_head.rows, v.rows);
        if (tied) {
          EXPECT_EQ(m.lm_head.data, m.embed.data);
        }
        for (const int64_t r : {int64_t{0}, v.rows - 1}) {
          EXPECT_EQ(row_of(m.embed, r), row_of(whole.views.embed, v.first + r));
          EXPECT_EQ(row_of(m.lm_head, r), row_of(whole.views.lm_head, v.first + r));
        }
        // ~1/N: bf16 rows of ceil(V / N) (the last share shorter), as the memory plan
        // counts them.
        const int64_t bytes = m.embed.storage_bytes() + (tied ? 0 : m.lm_head.storage_bytes());
        EXPECT_EQ(bytes, v.rows * row_bytes);
        EXPECT_LE(bytes * size, whole_bytes + size * row_bytes);  // < 1/N + one row
        EXPECT_LE(bytes, planned);
        if (rank == 0) {
          EXPECT_EQ(bytes, planned);
        }
        sum_bytes += bytes;
      }
      EXPECT_EQ(sum_bytes, whole_bytes) << size << " ranks";
    }
  }
}

TEST(TensorParallel, OddVocabLogitsMatchTheWholeModelOnEveryRank) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ModelConfig c = odd_vocab_config(tied);
    const std::vector<int32_t> prompt = odd_vocab_prompt(c);
    const auto make = [&](const ModelOptions& o) {
      return Model::create(c, std::make_unique<RandomWeights>(c, 5), o);
    };
    const std::vector<float> whole = run_ranks(1, false, make, prompt)[0];
    ASSERT_EQ(whole.size(), (prompt.size() + 1) * 1001);
    for (const int tp : {2, 4}) {
      SCOPED_TRACE("tp " + std::to_string(tp));
      // The same bits on every rank (the gathered logits), within tol of the whole model.
      expect_tp_matches(whole, run_ranks(tp, false, make, prompt), 1e-4);
    }
  }
}

TEST(TensorParallel, OddVocabBatchInvariantLogitsAreBitwiseTheSameEveryRun) {
  const ModelConfig c = odd_vocab_config(false);
  const std::vector<int32_t> prompt = odd_vocab_prompt(c);
  const auto make = [&](const ModelOptions& o) {
    return Model::create(c, std::make_unique<RandomWeights>(c, 6), o);
  };
  const std::vector<float> whole = run_ranks(1, true, make, prompt)[0];
  for (const int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const std::vector<std::vector<float>> a = run_ranks(tp, true, make, prompt);
    const std::vector<std::vector<float>> b = run_ranks(tp, true, make, prompt);
    for (int r = 0; r < tp; ++r) {
      ASSERT_EQ(a[r].size(), whole.size());
      EXPECT_EQ(0, std::memcmp(a[r].data(), b[r].data(), a[r].size() * 4)) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(a[r].data(), a[0].data(), a[r].size() * 4)) << "rank " << r;
    }
    expect_tp_matches(whole, a, 1e-4);
  }
}

TEST(TensorParallel, RefusesAShardThatSplitsAQuantizationGroup) {
  // The bundled tiny K3: MXFP4 experts of width 32, 16 columns of down_proj a rank at TP 2.
  const std::filesystem::path dir = source_path("models/tiny-kimi-k3");
  parallel::HashStore store;
  std::unique_ptr<parallel::Communicator> comm =
      parallel::make_cpu_communicator(store, 0, 1, 10s, "one");
  ModelOptions o;
  o.parallel.tp = {0, 2, nullptr};
  EXPECT_THROW(Model::load(dir, o), Error);  // no communicator for a group of 2
  // (Group of one communicator reports size 1, not 2: refused before any weight loads.)
  o.parallel.tp.comm = comm.get();
  EXPECT_THROW(Model::load(dir, o), Error);
  // The real refusal: a group of 2 whose shards split the MXFP4 groups, by tensor name.
  const ModelConfig c = ModelConfig::load(dir);
  const RandomWeights source(c, 1);
  LoadedWeights w = load_weights(c, source);
  try {
    shard_weights(c, 0, 2, w);
    FAIL() << "MXFP4 experts of 32 split over 2 ranks";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("experts.0.down_proj"), std::string::npos) << e.what();
  }
  // KDA heads: 2 do not split over 4 ranks.
  EXPECT_THROW(shard_config(c, 4), ConfigError);
}

}  // namespace
}  // namespace hyserve

namespace hyserve {
namespace {

// Expert parallelism: whole routed experts by index (E / N per rank), the shared experts
// and everything else as under TP; the MoE's partial sums meet in the same all-reduce.
class ExpertParallel : public testing::TestWithParam<TpCase> {};

TEST_P(ExpertParallel, LogitsMatchTheWholeModelOnEveryRank) {
  const std::filesystem::path dir = source_path(GetParam().dir);
  const ModelConfig c = ModelConfig::load(dir);
  const std::vector<int32_t> prompt = prompt_for(c);
  const auto whole_model = [&](const ModelOptions& o) { return Model::load(dir, o); };
  const auto ep_model = [&](const ModelOptions& o) {
    ModelOptions ep = o;
    ep.parallel.expert_parallel = true;
    return Model::load(dir, ep);
  };
  const std::vector<float> whole = run_ranks(1, false, whole_model, prompt)[0];
  for (const int tp : GetParam().sizes) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    expect_tp_matches(whole, run_ranks(tp, false, ep_model, prompt), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ExpertParallel,
                         testing::Values(TpCase{"tests/fixtures/kimi_linear_tiny", {2}},
                                         TpCase{"tests/fixtures/deepseek_v32_tiny", {2, 4}}),
                         [](const testing::TestParamInfo<TpCase>& p) {
                           return std::filesystem::path(p.param.dir).filename().string();
                         });

TEST(ExpertParallelLatentMoe, KimiK3MatchesTheWholeModelAndIsBitwiseRepeatable) {
  // The latent MoE's MXFP4 experts whole on their ranks (any width), shared experts split.
  ModelConfig c = ModelConfig::load(source_path("models/tiny-kimi-k3"));
  c.moe_intermediate_size = 64;
  const std::vector<int32_t> prompt = prompt_for(c);
  const auto make = [&](const ModelOptions& o) {
    ModelOptions ep = o;
    ep.parallel.expert_parallel = o.parallel.tp.size > 1;
    return Model::create(c, std::make_unique<RandomWeights>(c, 9), ep);
  };
  const std::vector<float> whole = run_ranks(1, false, make, prompt)[0];
  expect_tp_matches(whole, run_ranks(2, false, make, prompt), 1e-4);
  const std::vector<std::vector<float>> a = run_ranks(2, true, make, prompt);
  const std::vector<std::vector<float>> b = run_ranks(2, true, make, prompt);
  EXPECT_EQ(0, std::memcmp(a[0].data(), b[0].data(), a[0].size() * 4));
}

TEST(ExpertParallelConfig, KeepsExpertWidthsAndNeedsExpertsToDivide) {
  ModelConfig c = ModelConfig::load(source_path("tests/fixtures/deepseek_v32_tiny"));
  const ModelConfig ep = shard_config(c, 4, true);
  EXPECT_EQ(ep.moe_intermediate_size, c.moe_intermediate_size);
  EXPECT_EQ(ep.num_attention_heads * 4, c.num_attention_heads);
  EXPECT_EQ(expert_shard(16, 3, 4).first, 12);
  EXPECT_EQ(expert_shard(16, 3, 4).count, 4);
  // A rank keeps its experts whole, the others' not at all; the shared experts split.
  const RandomWeights source(c, 5);
  const LoadedWeights whole = load_weights(c, source);
  for (int rank = 0; rank < 4; ++rank) {
    const RandomWeights rank_source(c, 5);  // the same tensors as `source` gave
    LoadedWeights w = load_weights(c, rank_source);
    shard_weights(c, rank, 4, w, 1, true);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (!c.is_moe(l)) continue;
      const MoeWeights& m = w.views.layers[l].moe;
      ASSERT_EQ(std::ssize(m.experts), 4);
      for (int64_t e = 0; e < 4; ++e) {
        const MlpWeights& want = whole.views.layers[l].moe.experts[rank * 4 + e];
        EXPECT_EQ(m.experts[e].gate.rows, c.moe_intermediate_size);
        EXPECT_EQ(row_of(m.experts[e].down, 1), row_of(want.down, 1));  // that very expert
      }
      EXPECT_EQ(m.shared.gate.rows * 4, whole.views.layers[l].moe.shared.gate.rows);
    }
  }
  c.num_experts = 6;
  try {
    shard_config(c, 4, true);
    FAIL() << "6 experts over 4 ranks accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_routed_experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyserve
