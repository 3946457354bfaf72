// The fused KDA decode on the CPU (cpu::kda_decode) against its definition, the separate
// KDA ops run request by request: bitwise, for requests of 0 to 17 tokens, both gate
// forms, conv widths 1 to 4 and several head sizes; many tokens in one call against one
// token per call; the cache rows no request names untouched; bad arguments refused.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kda_decode_util.h"
#include "kernels/kda/cpu.h"
#include "util/error.h"

namespace hyserve {
namespace {

using test::KdaDecodeBatch;
using test::KdaDecodeResult;

TEST(KdaDecode, EqualsTheSeparateOpsBitwise) {
  uint32_t seed = 1;
  for (const int64_t dim : {8, 32, 128}) {
    for (const int64_t taps : {1, 2, 4}) {
      for (const float lower_bound : {0.0f, -5.0f}) {
        for (const std::vector<int32_t>& tokens :
             {std::vector<int32_t>{1}, {1, 1, 1}, {3, 0, 9, 1, 17}, {0, 0}}) {
          const KdaDecodeBatch in = test::make_kda_decode_batch(tokens, dim == 128 ? 2 : 3, dim,
                                                                taps, lower_bound, ++seed);
          const KdaDecodeResult want = test::kda_decode_by_ops(in);
          const KdaDecodeResult got = test::kda_decode_cpu(in);
          EXPECT_EQ(got.y, want.y) << in.name();
          EXPECT_EQ(got.cache, want.cache) << in.name();
          if (in.tokens() > 0) {
            EXPECT_NE(want.cache, in.cache) << in.name() << ": nothing was decoded";
          } else {
            EXPECT_EQ(got.cache, in.cache) << in.name() << ": no tokens, but a state changed";
          }
        }
      }
    }
  }
}

TEST(KdaDecode, NullOffsetsMeanOneTokenPerRow) {
  const KdaDecodeBatch in = test::make_kda_decode_batch({1, 1, 1, 1}, 2, 32, 4, 0.0f, 50);
  const KdaDecodeResult with_offsets = test::kda_decode_cpu(in);
  const KdaDecodeResult without = test::kda_decode_cpu(in, /*one_token_rows=*/true);
  EXPECT_EQ(with_offsets.y, without.y);
  EXPECT_EQ(with_offsets.cache, without.cache);
}

// Token j of every request that has one, as a batch of its own (a request without one
// gets 0 tokens), over `cache`.
KdaDecodeBatch token_of_each(const KdaDecodeBatch& in, int32_t j, const std::vector<float>& cache) {
  KdaDecodeBatch out = in;
  out.cache = cache;
  out.offsets.assign(1, 0);
  for (auto* x : {&out.q, &out.k, &out.v, &out.f, &out.gate, &out.b}) x->clear();
  const int64_t w = in.width(), h = in.heads;
  for (int64_t r = 0; r < in.rows(); ++r) {
    const bool has = in.offsets[r] + j < in.offsets[r + 1];
    out.offsets.push_back(out.offsets.back() + (has ? 1 : 0));
    if (!has) continue;
    const int64_t t = in.offsets[r] + j;
    const std::vector<float>* src[] = {&in.q, &in.k, &in.v, &in.f, &in.gate};
    std::vector<float>* dst[] = {&out.q, &out.k, &out.v, &out.f, &out.gate};
    for (int i = 0; i < 5; ++i) {
      dst[i]->insert(dst[i]->end(), src[i]->begin() + t * w, src[i]->begin() + (t + 1) * w);
    }
    out.b.insert(out.b.end(), in.b.begin() + t * h, in.b.begin() + (t + 1) * h);
  }
  return out;
}

TEST(KdaDecode, ManyTokensInOneCallEqualOneTokenPerCall) {
  const KdaDecodeBatch in = test::make_kda_decode_batch({9, 1, 0, 4, 17}, 2, 32, 4, -5.0f, 60);
  const KdaDecodeResult whole = test::kda_decode_cpu(in);
  std::vector<float> cache = in.cache;
  for (int32_t j = 0; j < 17; ++j) {
    const KdaDecodeBatch step = token_of_each(in, j, cache);
    const KdaDecodeResult got = test::kda_decode_cpu(step);
    cache = got.cache;
    int64_t i = 0;
    for (int64_t r = 0; r < in.rows(); ++r) {
      if (in.offsets[r] + j >= in.offsets[r + 1]) continue;
      const int64_t t = in.offsets[r] + j, w = in.width();
      const std::vector<float> want(whole.y.begin() + t * w, whole.y.begin() + (t + 1) * w);
      const std::vector<float> one(got.y.begin() + i * w, got.y.begin() + (i + 1) * w);
      EXPECT_EQ(one, want) << "request " << r << " token " << j;
      ++i;
    }
  }
  EXPECT_EQ(cache, whole.cache);
}

// Speculative verification: a verify call computes every token's output and leaves the states
// as they were; a commit of the first counts[r] tokens of each request (no outputs) leaves the
// states the separate ops give those tokens. Both bitwise.
TEST(KdaDecode, VerifyWritesNoStateAndCommitKeepsTheCountedTokens) {
  for (const float lower_bound : {0.0f, -5.0f}) {
    const KdaDecodeBatch in =
        test::make_kda_decode_batch({3, 0, 9, 1, 5}, 2, 32, 4, lower_bound, 80);
    const KdaDecodeResult full = test::kda_decode_cpu(in);
    const KdaDecodeResult verified =
        test::kda_decode_cpu(in, false, {.write_state = false, .outputs = true, .counts = {}});
    EXPECT_EQ(verified.y, full.y);
    EXPECT_EQ(verified.cache, in.cache);
    for (const std::vector<int32_t>& counts :
         {std::vector<int32_t>{1, 0, 1, 1, 1}, {2, 0, 9, 1, 3}, {3, 5, 9, 1, 5}, {0, 0, 4, 0, 7}}) {
      const KdaDecodeResult committed = test::kda_decode_cpu(
          in, false, {.write_state = true, .outputs = false, .counts = counts});
      const KdaDecodeResult want = test::kda_decode_by_ops(test::kept_tokens(in, counts));
      EXPECT_EQ(committed.cache, want.cache) << counts[0] << "," << counts[4];
      EXPECT_EQ(committed.y, std::vector<float>(full.y.size(), 0.0f)) << "a commit wrote outputs";
    }
  }
}

TEST(KdaDecode, RejectsBadArguments) {
  KdaDecodeBatch in = test::make_kda_decode_batch({2, 1}, 2, 8, 4, 0.0f, 70);
  std::vector<float> y(in.tokens() * in.width());
  const test::KdaDecodePointers ptr = test::host_pointers(in, in.cache.data(), y.data());
  const KdaDecodeParams good = test::kda_decode_params(in, ptr);
  EXPECT_NO_THROW(cpu::kda_decode(good));
  auto refused = [&](auto edit) {
    KdaDecodeParams p = good;
    edit(p);
    EXPECT_THROW(cpu::kda_decode(p), InvalidArgument);
  };
  refused([](KdaDecodeParams& p) { p.kernel_size = 0; });
  refused([](KdaDecodeParams& p) { p.kernel_size = kKdaMaxDecodeConv + 1; });
  refused([](KdaDecodeParams& p) { p.lower_bound = 1.0f; });
  refused([](KdaDecodeParams& p) { p.state = nullptr; });
  refused([](KdaDecodeParams& p) { p.conv_state[1] = nullptr; });
  refused([](KdaDecodeParams& p) { p.state_row_bytes = 0; });
  refused([](KdaDecodeParams& p) { p.token_offsets = nullptr; });  // 3 tokens, 2 rows
  refused([](KdaDecodeParams& p) { p.gate = nullptr; });
  refused([](KdaDecodeParams& p) { p.head_dim = 0; });
  refused([](KdaDecodeParams& p) {  // nothing to do
    p.y = nullptr;
    p.write_state = false;
  });
}

}  // namespace
}  // namespace hyserve
