// CUDA logits processors and log-probabilities against the CPU ops (kernels/logits) on
// random batches of awkward shapes, with ties, +-0, NaN, -inf, all-NaN and all-masked rows.
// Everything must be EQUAL (NaN matches any NaN: the device does not keep NaN payloads)
// except the logprob values, whose double log-sum-exp is summed in another order with the
// device exp / log: they may differ by 2 fp32 ulp plus 1e-12 (the double error that
// survives where l - log_z cancels); ranks and top ids are exact. Last, the two Backends run
// the runner's whole sequence, sampling included, on the same batch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"
#include "kernels/logits/cpu.h"
#include "kernels/logits/cuda.h"

namespace hyserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kVocabs[] = {1, 3, 63, 65, 321, 163840};

// Equal floats, bit for bit (so -0 != +0), any NaN matching any NaN.
testing::AssertionResult same_values(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]))
      return testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
  return testing::AssertionSuccess();
}

// The logprob tolerance of the header comment.
testing::AssertionResult close_logprobs(const std::vector<float>& got,
                                        const std::vector<float>& want) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w) || std::isinf(w)) {
      ok = std::isnan(w) ? std::isnan(g) : g == w;
    } else {
      const double ulp = std::nextafter(std::fabs(w), kInf) - std::fabs(w);
      ok = std::fabs(static_cast<double>(g) - w) <= 2.0 * ulp + 1e-12;
    }
    if (!ok) {
      return testing::AssertionFailure()
             << "element " << i << ": got " << g << ", want " << w << " (diff " << g - w << ")";
    }
  }
  return testing::AssertionSuccess();
}

// kind 0: normal; 1: halves (many ties, +-0); 2: wide, with NaN and -inf; 3: as 2 with
// rows that are all NaN, all -inf or all one value.
std::vector<float> random_logits(int64_t rows, int64_t vocab, std::mt19937_64& rng, int kind) {
  std::normal_distribution<float> d(0.0f, kind >= 2 ? 8.0f : 2.0f);
  std::vector<float> v(rows * vocab);
  for (float& x : v) {
    x = d(rng);
    if (kind == 1) x = std::round(x * 2.0f) / 2.0f;
    if (kind >= 2 && rng() % 13 == 0) x = rng() % 2 ? NAN : -kInf;
  }
  if (kind == 3) {
    const float fills[] = {NAN, -kInf, 1.5f, kInf};
    for (int64_t r = 0; r < rows; r += 3) {
      std::fill(v.begin() + r * vocab, v.begin() + (r + 1) * vocab, fills[(r / 3) % 4]);
    }
  }
  return v;
}

int64_t random_rows(std::mt19937_64& rng, int64_t vocab) {
  return 1 + static_cast<int64_t>(rng() % (vocab > 100000 ? 24 : 67));
}

std::string trace(int64_t vocab, int64_t rows, int kind) {
  return "vocab " + std::to_string(vocab) + " rows " + std::to_string(rows) + " kind " +
         std::to_string(kind);
}

template <typename T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  return cuda::to_host<T>(b, n);
}

TEST(GpuLogits, PenaltiesEqualCpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(1);
  for (int64_t vocab : kVocabs) {
    for (int kind = 0; kind < 4; ++kind) {
      const int64_t rows = random_rows(rng, vocab), max_rows = rows + 3;
      SCOPED_TRACE(trace(vocab, rows, kind));
      std::vector<int32_t> persistent(max_rows);
      std::iota(persistent.begin(), persistent.end(), 0);
      std::shuffle(persistent.begin(), persistent.end(), rng);
      persistent.resize(rows);
      persistent[0] = persistent[rows - 1];  // two logits rows of one request
      std::vector<float> repetition(max_rows), presence(max_rows), frequency(max_rows);
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      for (int64_t r = 0; r < max_rows; ++r) {
        repetition[r] = rng() % 3 == 0 ? 1.0f : std::exp(u(rng) * 0.5f);
        presence[r] = rng() % 3 == 0 ? 0.0f : u(rng);
        frequency[r] = rng() % 3 == 0 ? 0.0f : u(rng);
      }
      const int64_t words = token_mask_words(vocab);
      std::vector<int32_t> counts(max_rows * vocab, 0);
      for (int32_t& c : counts) c = rng() % 4 == 0 ? static_cast<int32_t>(rng() % 5) : 0;
      std::vector<uint32_t> prompt(max_rows * words);
      for (uint32_t& w : prompt) w = static_cast<uint32_t>(rng() & rng());
      std::vector<float> want = random_logits(rows, vocab, rng, kind);

      const cuda::DeviceBuffer d_logits = cuda::to_device(want),
                               d_rows = cuda::to_device(persistent),
                               d_rep = cuda::to_device(repetition),
                               d_pres = cuda::to_device(presence),
                               d_freq = cuda::to_device(frequency),
                               d_counts = cuda::to_device(counts),
                               d_prompt = cuda::to_device(prompt);
      PenaltyParams p{.logits = want.data(),
                      .rows = persistent.data(),
                      .repetition = repetition.data(),
                      .presence = presence.data(),
                      .frequency = frequency.data(),
                      .output_counts = counts.data(),
                      .prompt_mask = prompt.data(),
                      .num_rows = rows,
                      .vocab = vocab};
      cpu::apply_penalties(p);
      cuda::apply_penalties({.logits = d_logits.as<float>(),
                             .rows = d_rows.as<int32_t>(),
                             .repetition = d_rep.as<float>(),
                             .presence = d_pres.as<float>(),
                             .frequency = d_freq.as<float>(),
                             .output_counts = d_counts.as<int32_t>(),
                             .prompt_mask = d_prompt.as<uint32_t>(),
                             .num_rows = rows,
                             .vocab = vocab},
                            nullptr);
      EXPECT_TRUE(same_values(download<float>(d_logits, want.size()), want));
    }
  }
}

TEST(GpuLogits, CountTokensEqualCpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(2);
  for (int64_t vocab : kVocabs) {
    const int64_t max_rows = 5, num_tokens = 1 + static_cast<int64_t>(rng() % 3000);
    SCOPED_TRACE(trace(vocab, num_tokens, 0));
    std::vector<int32_t> counts(max_rows * vocab);
    for (int32_t& c : counts) c = static_cast<int32_t>(rng() % 3);
    std::vector<int32_t> rows(num_tokens), tokens(num_tokens);
    for (int64_t i = 0; i < num_tokens; ++i) {
      rows[i] = static_cast<int32_t>(rng() % max_rows);
      tokens[i] = static_cast<int32_t>(rng() % (vocab + 2)) - 1;  // -1 and vocab skipped
      if (i % 7 == 0) tokens[i] = tokens[0];                      // repeated (row, token)
    }
    const cuda::DeviceBuffer d_counts = cuda::to_device(counts), d_rows = cuda::to_device(rows),
                             d_tokens = cuda::to_device(tokens);
    cpu::count_tokens({counts.data(), rows.data(), tokens.data(), num_tokens, vocab});
    cuda::count_tokens(
        {d_counts.as<int32_t>(), d_rows.as<int32_t>(), d_tokens.as<int32_t>(), num_tokens, vocab},
        nullptr);
    EXPECT_EQ(download<int32_t>(d_counts, counts.size()), counts);
  }
}

TEST(GpuLogits, AdjustEqualsCpuAndSkipsOutOfRangeEntries) {
  REQUIRE_GPU();
  std::mt19937_64 rng(3);
  for (int64_t vocab : kVocabs) {
    for (LogitAdjustMode mode : {LogitAdjustMode::kAdd, LogitAdjustMode::kBan}) {
      const int64_t rows = random_rows(rng, vocab);
      SCOPED_TRACE(trace(vocab, rows, static_cast<int>(mode)));
      std::vector<int64_t> cells(rows * vocab);
      std::iota(cells.begin(), cells.end(), 0);
      std::shuffle(cells.begin(), cells.end(), rng);
      cells.resize(std::min<size_t>(cells.size(), 1 + rng() % 500));
      std::vector<int32_t> row, id;
      std::vector<float> value;
      for (int64_t c : cells) {
        row.push_back(static_cast<int32_t>(c / vocab));
        id.push_back(static_cast<int32_t>(c % vocab));
        value.push_back(std::uniform_real_distribution<float>(-5.0f, 5.0f)(rng));
      }
      std::vector<float> want = random_logits(rows, vocab, rng, 2);
      const cuda::DeviceBuffer d_logits = cuda::to_device(want);
      const auto n = static_cast<int64_t>(row.size());
      cpu::adjust_logits({want.data(), row.data(), id.data(), value.data(), n, rows, vocab, mode});
      // The device skips what the CPU refuses.
      const std::vector<int32_t> bad_row = {-1, static_cast<int32_t>(rows), 0, 0};
      const std::vector<int32_t> bad_id = {0, 0, -1, static_cast<int32_t>(vocab)};
      row.insert(row.begin(), bad_row.begin(), bad_row.end());
      id.insert(id.begin(), bad_id.begin(), bad_id.end());
      value.insert(value.begin(), 4, 1.0f);
      const cuda::DeviceBuffer d_row = cuda::to_device(row), d_id = cuda::to_device(id),
                               d_value = cuda::to_device(value);
      cuda::adjust_logits(
          {d_logits.as<float>(), d_row.as<int32_t>(), d_id.as<int32_t>(),
           mode == LogitAdjustMode::kAdd ? d_value.as<float>() : nullptr, n + 4, rows, vocab, mode},
          nullptr);
      EXPECT_TRUE(same_values(download<float>(d_logits, want.size()), want));
    }
  }
}

TEST(GpuLogits, TokenMaskEqualsCpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(4);
  for (int64_t vocab : kVocabs) {
    for (int kind = 0; kind < 4; ++kind) {
      const int64_t rows = random_rows(rng, vocab), words = token_mask_words(vocab);
      SCOPED_TRACE(trace(vocab, rows, kind));
      std::vector<float> want = random_logits(rows, vocab, rng, kind);
      std::vector<int32_t> masked;
      for (int32_t r = 0; r < rows; ++r) {
        if (rng() % 4 != 0) masked.push_back(r);
      }
      std::shuffle(masked.begin(), masked.end(), rng);
      std::vector<uint32_t> masks(masked.size() * words, 0);
      for (size_t k = 0; k < masked.size(); ++k) {
        uint32_t* m = masks.data() + k * words;
        float* l = want.data() + masked[k] * vocab;
        switch (k % 5) {
          case 0:  // nothing allowed (padding bits set): left unchanged
            if (vocab % 32 != 0) m[words - 1] = ~0u << (vocab % 32);
            break;
          case 1:  // every allowed logit -inf or NaN: the allowed ids get 0
            for (int64_t j = 0; j < 3; ++j) {
              const int64_t id = static_cast<int64_t>(rng() % vocab);
              m[id / 32] |= 1u << (id % 32);
              l[id] = j == 0 ? NAN : -kInf;
            }
            for (int64_t id = 0; id < vocab; ++id) {
              if ((m[id / 32] >> (id % 32)) & 1u) l[id] = l[id] > -kInf ? -kInf : l[id];
            }
            break;
          case 2:  // a few ids
            for (int j = 0; j < 4; ++j) {
              const int64_t id = static_cast<int64_t>(rng() % vocab);
              m[id / 32] |= 1u << (id % 32);
            }
            break;
          default:  // random half, all bits of the last word
            for (int64_t w = 0; w < words; ++w) m[w] = static_cast<uint32_t>(rng());
            m[words - 1] = ~0u;
        }
      }
      const cuda::DeviceBuffer d_logits = cuda::to_device(want), d_rows = cuda::to_device(masked),
                               d_masks = cuda::to_device(masks);
      const auto n = static_cast<int64_t>(masked.size());
      cpu::apply_token_mask({want.data(), masked.data(), masks.data(), n, rows, vocab});
      cuda::apply_token_mask(
          {d_logits.as<float>(), d_rows.as<int32_t>(), d_masks.as<uint32_t>(), n, rows, vocab},
          nullptr);
      EXPECT_TRUE(same_values(download<float>(d_logits, want.size()), want));
    }
  }
}

TEST(GpuLogits, LogprobsEqualCpu) {
  REQUIRE_GPU();
  std::mt19937_64 rng(5);
  for (int64_t vocab : kVocabs) {
    for (int kind = 0; kind < 4; ++kind) {
      for (int32_t top_n :
           {0, static_cast<int32_t>(1 + rng() % kMaxTopLogprobs), kMaxTopLogprobs}) {
        const int64_t rows = random_rows(rng, vocab);
        SCOPED_TRACE(trace(vocab, rows, kind) + " top_n " + std::to_string(top_n));
        const std::vector<float> logits = random_logits(rows, vocab, rng, kind);
        std::vector<int32_t> targets(rows);
        for (int64_t r = 0; r < rows; ++r) {
          targets[r] = static_cast<int32_t>(rng() % vocab);
          if (r % 4 == 1) {  // the row's best id (rank 1), the target a sampler would draw
            targets[r] = static_cast<int32_t>(
                std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab) -
                (logits.begin() + r * vocab));
          }
        }
        std::vector<float> logprob(rows), top_logprobs(rows * top_n);
        std::vector<int64_t> rank(rows);
        std::vector<int32_t> top_ids(rows * top_n);
        cpu::token_logprobs({logits.data(), targets.data(), rows, vocab, top_n, logprob.data(),
                             rank.data(), top_ids.data(), top_logprobs.data()});

        const cuda::DeviceBuffer d_logits = cuda::to_device(logits),
                                 d_targets = cuda::to_device(targets),
                                 d_logprob(rows * sizeof(float)), d_rank(rows * sizeof(int64_t)),
                                 d_top_ids(rows * top_n * sizeof(int32_t) + 4),
                                 d_top_logprobs(rows * top_n * sizeof(float) + 4);
        cuda::token_logprobs({d_logits.as<float>(), d_targets.as<int32_t>(), rows, vocab, top_n,
                              d_logprob.as<float>(), d_rank.as<int64_t>(), d_top_ids.as<int32_t>(),
                              d_top_logprobs.as<float>()},
                             nullptr);
        EXPECT_EQ(download<int64_t>(d_rank, rows), rank);
        EXPECT_EQ(download<int32_t>(d_top_ids, top_ids.size()), top_ids);
        EXPECT_TRUE(close_logprobs(download<float>(d_logprob, rows), logprob));
        EXPECT_TRUE(
            close_logprobs(download<float>(d_top_logprobs, top_logprobs.size()), top_logprobs));
      }
    }
  }
}

TEST(GpuLogits, RefusesBadShapesAndHandlesBadTargets) {
  REQUIRE_GPU();
  EXPECT_NO_THROW(cuda::token_logprobs({.num_rows = 0, .vocab = 3}, nullptr));
  EXPECT_THROW(cuda::token_logprobs({.num_rows = 0, .vocab = 0}, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::token_logprobs({.num_rows = 0, .vocab = 3, .top_n = 21}, nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::token_logprobs({.num_rows = 1, .vocab = 3}, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::apply_penalties({.num_rows = 1, .vocab = 3}, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::count_tokens({.num_tokens = 1, .vocab = 3}, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::adjust_logits({.num_entries = 1, .num_rows = 1, .vocab = 3}, nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::apply_token_mask({.num_masked = 1, .num_rows = 1, .vocab = 3}, nullptr),
               InvalidArgument);

  const cuda::DeviceBuffer logits = cuda::to_device(std::vector<float>{0.0f, 1.0f, 2.0f});
  const cuda::DeviceBuffer targets = cuda::to_device(std::vector<int32_t>{3});
  const cuda::DeviceBuffer logprob(sizeof(float)), rank(sizeof(int64_t));
  cuda::token_logprobs(
      {logits.as<float>(), targets.as<int32_t>(), 1, 3, 0, logprob.as<float>(), rank.as<int64_t>()},
      nullptr);
  EXPECT_TRUE(std::isnan(download<float>(logprob, 1)[0]));
  EXPECT_EQ(download<int64_t>(rank, 1)[0], 0);
}

// A batch in one backend's memory.
struct BackendBatch {
  template <typename T>
  T* put(const std::vector<T>& v) {
    buffers.emplace_back(backend, v.size() * sizeof(T) + 4);
    backend->upload(buffers.back().data(), v.data(), v.size() * sizeof(T));
    return buffers.back().as<T>();
  }
  template <typename T>
  std::vector<T> get(const T* p, size_t n) {
    std::vector<T> v(n);
    backend->download(v.data(), p, n * sizeof(T));
    return v;
  }
  Backend* backend;
  std::vector<DeviceAllocation> buffers;
};

// The runner's sequence through both Backends: count the last outputs, penalties, bias,
// bans, masks, logprobs of the raw logits, sampling with random options on vocab 163840.
TEST(GpuLogits, BackendsAgreeOnTheWholeSequence) {
  REQUIRE_GPU();
  const std::unique_ptr<Backend> cpu_backend = make_cpu_backend();
  const std::unique_ptr<Backend> cuda_backend = make_cuda_backend(0);
  std::mt19937_64 rng(6);
  const int64_t vocab = 163840, words = token_mask_words(vocab);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t rows = 40, max_rows = rows + 8;
    SCOPED_TRACE(trial);
    const std::vector<float> raw = random_logits(rows, vocab, rng, trial == 2 ? 3 : trial);
    std::vector<int32_t> persistent(max_rows);
    std::iota(persistent.begin(), persistent.end(), 0);
    std::shuffle(persistent.begin(), persistent.end(), rng);
    persistent.resize(rows);
    std::vector<float> repetition(max_rows, 1.0f), presence(max_rows, 0.0f),
        frequency(max_rows, 0.0f);
    std::vector<int32_t> counts(max_rows * vocab, 0);
    std::vector<uint32_t> prompt(max_rows * words, 0);
    std::vector<int32_t> last_rows, last_tokens, bias_rows, bias_ids, ban_rows, ban_ids, masked;
    std::vector<float> bias_values;
    std::vector<uint32_t> masks;
    std::vector<SamplingOptions> options(rows);
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t pr = persistent[i];
      repetition[pr] = i % 3 == 0 ? 1.0f : 1.2f;
      presence[pr] = i % 4 == 0 ? 0.0f : 0.7f;
      frequency[pr] = i % 5 == 0 ? 0.0f : -0.3f;
      for (int j = 0; j < 50; ++j) {
        ++counts[pr * vocab + static_cast<int64_t>(rng() % 2000)];
        const int64_t id = static_cast<int64_t>(rng() % vocab);
        prompt[pr * words + id / 32] |= 1u << (id % 32);
      }
      last_rows.push_back(pr);
      last_tokens.push_back(i % 9 == 0 ? -1 : static_cast<int32_t>(rng() % 2000));
      for (int32_t id : {3, 77, 1000}) {
        bias_rows.push_back(i);
        bias_ids.push_back(id + i);
        bias_values.push_back(static_cast<float>(i % 7) - 3.0f);
      }
      ban_rows.push_back(i);
      ban_ids.push_back(i % 2);
      if (i % 3 == 1) {
        masked.push_back(i);
        for (int64_t w = 0; w < words; ++w) masks.push_back(i % 6 == 1 ? ~0u : rng() & rng());
      }
      const float temperatures[] = {0.0f, 0.4f, 1.0f, 1.8f};
      const int32_t top_ks[] = {0, 1, 20, 5000};
      const float top_ps[] = {1.0f, 0.95f, 0.5f};
      const float min_ps[] = {0.0f, 0.0f, 0.02f};
      options[i] = {.temperature = temperatures[rng() % 4],
                    .top_k = top_ks[rng() % 4],
                    .top_p = top_ps[rng() % 3],
                    .min_p = min_ps[rng() % 3],
                    .seed = rng(),
                    .step = rng() % 100};
    }
    std::vector<int32_t> targets(rows);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng() % vocab);
    const int32_t top_n = 7;
    const auto ws_bytes = static_cast<size_t>(sampling::sample_workspace_bytes(rows, vocab));

    struct Out {
      std::vector<float> logits, logprob, top_logprobs;
      std::vector<int64_t> rank;
      std::vector<int32_t> top_ids, tokens, counts;
    };
    const auto run = [&](Backend* backend) {
      BackendBatch b{backend, {}};
      float* logits = b.put(raw);
      const int32_t* rows_p = b.put(persistent);
      int32_t* counts_p = b.put(counts);
      float* logprob = b.put(std::vector<float>(rows));
      int64_t* rank = b.put(std::vector<int64_t>(rows));
      int32_t* top_ids = b.put(std::vector<int32_t>(rows * top_n));
      float* top_logprobs = b.put(std::vector<float>(rows * top_n));
      int32_t* tokens = b.put(std::vector<int32_t>(rows));
      backend->token_logprobs(
          {logits, b.put(targets), rows, vocab, top_n, logprob, rank, top_ids, top_logprobs});
      backend->count_tokens({counts_p, b.put(last_rows), b.put(last_tokens), rows, vocab});
      backend->apply_penalties({logits, rows_p, b.put(repetition), b.put(presence),
                                b.put(frequency), counts_p, b.put(prompt), rows, vocab});
      backend->adjust_logits({logits, b.put(bias_rows), b.put(bias_ids), b.put(bias_values),
                              static_cast<int64_t>(bias_rows.size()), rows, vocab,
                              LogitAdjustMode::kAdd});
      backend->adjust_logits({logits, b.put(ban_rows), b.put(ban_ids), nullptr,
                              static_cast<int64_t>(ban_rows.size()), rows, vocab,
                              LogitAdjustMode::kBan});
      backend->apply_token_mask(
          {logits, b.put(masked), b.put(masks), static_cast<int64_t>(masked.size()), rows, vocab});
      backend->sample_tokens({logits, b.put(options), tokens, rows, vocab,
                              b.put(std::vector<uint8_t>(ws_bytes)), ws_bytes});
      backend->synchronize();
      return Out{b.get(logits, raw.size()),         b.get(logprob, rows),
                 b.get(top_logprobs, rows * top_n), b.get(rank, rows),
                 b.get(top_ids, rows * top_n),      b.get(tokens, rows),
                 b.get(counts_p, counts.size())};
    };
    const Out want = run(cpu_backend.get());
    const Out got = run(cuda_backend.get());
    EXPECT_EQ(got.counts, want.counts);
    EXPECT_TRUE(same_values(got.logits, want.logits));
    EXPECT_EQ(got.rank, want.rank);
    EXPECT_EQ(got.top_ids, want.top_ids);
    EXPECT_TRUE(close_logprobs(got.logprob, want.logprob));
    EXPECT_TRUE(close_logprobs(got.top_logprobs, want.top_logprobs));
    EXPECT_EQ(got.tokens, want.tokens);
    // The sampled tokens of the processed logits, on the raw logits too.
    const auto sample_raw = [&](Backend* backend) {
      BackendBatch b{backend, {}};
      int32_t* tokens = b.put(std::vector<int32_t>(rows));
      backend->sample_tokens({b.put(raw), b.put(options), tokens, rows, vocab,
                              b.put(std::vector<uint8_t>(ws_bytes)), ws_bytes});
      return b.get(tokens, rows);
    };
    EXPECT_EQ(sample_raw(cuda_backend.get()), sample_raw(cpu_backend.get()));
  }
}

}  // namespace
}  // namespace hyserve
