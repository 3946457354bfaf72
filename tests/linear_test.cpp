// linear and embedding_lookup: every weight format against double-precision
// dense math on the decoded weights, weights built here by quantizing random
// values; batch invariance (T tokens at once == each token alone, bitwise).
#include "kernels/linear/params.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/tensor_parallel.h"
#include "quantized_weights.h"
#include "util/error.h"

namespace hyserve::cpu {
namespace {

using test::Format;
using test::format_name;
using test::quantize;
using TestWeight = test::HostWeight;

using test::decode;
using test::random_vector;

const auto& kFormats = test::kAllFormats;

// The whole table's lookup.
void lookup(const Weight& table, const int32_t* ids, int64_t n, float* out) {
  embedding_lookup(EmbeddingParams{&table, ids, out, n, 0, table.rows});
}

std::vector<int64_t> cols_for(Format f) {
  if (test::needs_cols_of_32(f)) return {32, 96};
  return {1, 3, 65, 200};
}

// The quantizers above produce weights close to their source, so the linear
// tests below multiply meaningful matrices.
TEST(Linear, QuantizedWeightsApproximateTheirSource) {
  std::mt19937 rng(10);
  for (Format f : kFormats) {
    const int64_t rows = 130, cols = test::needs_cols_of_32(f) ? 96 : 200;
    const auto src = random_vector(rows * cols, rng);
    const TestWeight t = quantize(src, rows, cols, f);
    const auto deq = decode(t.w);
    double rel = 1.0 / 256;
    if (f == Format::kFp8F32Scales || f == Format::kFp8Bf16Scales) rel = 1.0 / 16;
    if (f == Format::kMxfp4) rel = 1.0 / 4;
    for (int64_t i = 0; i < rows * cols; ++i) {
      // The absolute term covers values far below the block's amax (at most ~5).
      double tol = rel * std::fabs(src[i]) + (f == Format::kMxfp4 ? 0.25 : 0.01);
      if (f == Format::kInt4) {
        // Rounding to the nearest multiple of the group's scale, bf16(amax / 7).
        const int64_t g0 = i - i % 32;
        double amax = 0.0;
        for (int64_t k = g0; k < g0 + 32; ++k) amax = std::max(amax, std::fabs(double{src[k]}));
        tol = amax / 14.0 * (1.0 + 0x1p-8) + 1e-7;
      }
      ASSERT_LE(std::fabs(deq[i] - src[i]), tol) << format_name(f) << " element " << i;
    }
  }
}

TEST(Linear, MatchesDoubleMathForEveryFormat) {
  std::mt19937 rng(11);
  for (Format f : kFormats) {
    for (int64_t rows : {1, 3, 63, 65, 130}) {
      for (int64_t cols : cols_for(f)) {
        for (int64_t num_tokens : {1, 3, 63, 65}) {
          for (bool with_bias : {false, true}) {
            const TestWeight t = quantize(random_vector(rows * cols, rng), rows, cols, f);
            const auto x = random_vector(num_tokens * cols, rng);
            const auto bias = random_vector(rows, rng);
            std::vector<float> y(num_tokens * rows, NAN);
            linear({.x = x.data(),
                    .w = &t.w,
                    .y = y.data(),
                    .num_tokens = num_tokens,
                    .bias = with_bias ? bias.data() : nullptr});
            const auto w = decode(t.w);
            // fp32 summation of cols products: error <= (cols + 2) * 2^-24 * sum |terms|.
            double worst = 0.0;
            int64_t worst_t = -1, worst_r = -1;
            for (int64_t tok = 0; tok < num_tokens; ++tok) {
              for (int64_t r = 0; r < rows; ++r) {
                double ref = with_bias ? bias[r] : 0.0;
                double mag = std::fabs(ref);
                for (int64_t c = 0; c < cols; ++c) {
                  ref += static_cast<double>(x[tok * cols + c]) * w[r * cols + c];
                  mag += std::fabs(static_cast<double>(x[tok * cols + c]) * w[r * cols + c]);
                }
                const double tol = (cols + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
                const double ratio = std::fabs(y[tok * rows + r] - ref) / tol;
                if (!(ratio <= worst)) {
                  worst = ratio;
                  worst_t = tok;
                  worst_r = r;
                }
              }
            }
            EXPECT_LE(worst, 1.0) << format_name(f) << " rows " << rows << " cols " << cols
                                  << " tokens " << num_tokens << " bias " << with_bias
                                  << ": worst error/tolerance at token " << worst_t << ", row "
                                  << worst_r;
          }
        }
      }
    }
  }
}

TEST(Linear, BatchOfTokensEqualsEachTokenAloneBitwise) {
  std::mt19937 rng(12);
  for (Format f : kFormats) {
    const int64_t rows = 65, cols = test::needs_cols_of_32(f) ? 96 : 200, num_tokens = 65;
    const TestWeight t = quantize(random_vector(rows * cols, rng), rows, cols, f);
    const auto x = random_vector(num_tokens * cols, rng);
    const auto bias = random_vector(rows, rng);
    std::vector<float> batch(num_tokens * rows);
    linear({.x = x.data(),
            .w = &t.w,
            .y = batch.data(),
            .num_tokens = num_tokens,
            .bias = bias.data()});
    for (int64_t tok = 0; tok < num_tokens; ++tok) {
      std::vector<float> alone(rows);
      linear({.x = x.data() + tok * cols,
              .w = &t.w,
              .y = alone.data(),
              .num_tokens = 1,
              .bias = bias.data()});
      ASSERT_EQ(std::memcmp(alone.data(), batch.data() + tok * rows, rows * sizeof(float)), 0)
          << format_name(f) << " token " << tok;
    }
  }
}

TEST(Linear, ZeroTokensWritesNothing) {
  std::mt19937 rng(13);
  const TestWeight t = quantize(random_vector(6, rng), 2, 3, Format::kF32);
  const float x = 0.0f;
  float y = 7.0f;
  linear({.x = &x, .w = &t.w, .y = &y, .num_tokens = 0});
  EXPECT_EQ(y, 7.0f);
}

TEST(Linear, RejectsAliasingAndBadArguments) {
  std::mt19937 rng(14);
  const TestWeight t = quantize(random_vector(9, rng), 3, 3, Format::kF32);
  std::vector<float> buf(12);
  EXPECT_THROW(linear({.x = buf.data(), .w = &t.w, .y = buf.data(), .num_tokens = 2}),
               InvalidArgument);
  EXPECT_THROW(linear({.x = buf.data(), .w = &t.w, .y = buf.data() + 5, .num_tokens = 2}),
               InvalidArgument);
  EXPECT_NO_THROW(linear({.x = buf.data(), .w = &t.w, .y = buf.data() + 6, .num_tokens = 2}));
  EXPECT_THROW(linear({.x = buf.data(), .w = nullptr, .y = buf.data() + 6, .num_tokens = 2}),
               InvalidArgument);
  EXPECT_THROW(linear({.x = buf.data(), .w = &t.w, .y = buf.data() + 6, .num_tokens = -1}),
               InvalidArgument);
}

TEST(Embedding, GathersDecodedRows) {
  std::mt19937 rng(15);
  for (Format f : {Format::kF32, Format::kBF16, Format::kFp8F32Scales, Format::kMxfp4}) {
    const int64_t vocab = 130, dim = f == Format::kMxfp4 ? 64 : 65;
    const TestWeight t = quantize(random_vector(vocab * dim, rng), vocab, dim, f);
    const auto table = decode(t.w);
    const std::vector<int32_t> ids = {0, 129, 5, 5, 128, 64};
    std::vector<float> out(ids.size() * dim);
    lookup(t.w, ids.data(), static_cast<int64_t>(ids.size()), out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(std::memcmp(out.data() + i * dim, table.data() + ids[i] * dim, dim * sizeof(float)),
                0)
          << format_name(f) << " position " << i;
    }
  }
}

TEST(Embedding, OutOfRangeIdIsNamed) {
  std::mt19937 rng(16);
  const TestWeight t = quantize(random_vector(12, rng), 4, 3, Format::kF32);
  std::vector<float> out(6);
  for (int32_t bad : {4, -1, 1000}) {
    const int32_t ids[2] = {1, bad};
    try {
      lookup(t.w, ids, 2, out.data());
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("token id " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
}

// A tensor-parallel rank's share of the table (vocab_rows): its ids give the whole table's
// rows, the others -0.0f, so that the ranks' rows sum to the lookup bitwise; ids are
// checked against the whole vocabulary.
TEST(Embedding, ShardGivesItsRowsAndNegativeZeroElsewhere) {
  std::mt19937 rng(17);
  for (Format f : {Format::kF32, Format::kBF16, Format::kMxfp4}) {
    SCOPED_TRACE(format_name(f));
    const int64_t vocab = 131, dim = 64;
    std::vector<float> values = random_vector(vocab * dim, rng);
    values[5 * dim + 3] = -0.0f;  // a stored -0.0 survives the sum too
    const TestWeight t = quantize(values, vocab, dim, f);
    const std::vector<int32_t> ids = {0, 130, 5, 44, 45, 88, 89, 66};
    const auto n = static_cast<int64_t>(ids.size());
    std::vector<float> whole(ids.size() * dim);
    lookup(t.w, ids.data(), n, whole.data());
    for (const int size : {2, 3}) {
      std::vector<float> sum(ids.size() * dim, -0.0f);
      for (int rank = 0; rank < size; ++rank) {
        const VocabShard v = vocab_shard(vocab, rank, size);
        const Weight part = vocab_rows(t.w, v, "embed");
        std::vector<float> out(ids.size() * dim, 1.0f);
        embedding_lookup(EmbeddingParams{&part, ids.data(), out.data(), n, v.first, vocab});
        for (int64_t i = 0; i < n; ++i) {
          const bool here = ids[i] >= v.first && ids[i] < v.first + v.rows;
          for (int64_t k = 0; k < dim; ++k) {
            const float got = out[i * dim + k];
            if (here) {
              ASSERT_EQ(std::memcmp(&got, &whole[i * dim + k], 4), 0) << rank << " " << i;
            } else {
              ASSERT_TRUE(got == 0.0f && std::signbit(got)) << rank << " " << i << " " << got;
            }
            sum[i * dim + k] += got;
          }
        }
      }
      ASSERT_EQ(std::memcmp(sum.data(), whole.data(), whole.size() * 4), 0) << size << " ranks";
    }
    const VocabShard v = vocab_shard(vocab, 1, 2);
    const Weight part = vocab_rows(t.w, v, "embed");
    std::vector<float> out(dim);
    const int32_t bad = static_cast<int32_t>(vocab);
    EXPECT_THROW(embedding_lookup(EmbeddingParams{&part, &bad, out.data(), 1, v.first, vocab}),
                 InvalidArgument);
  }
}

}  // namespace
}  // namespace hyserve::cpu
