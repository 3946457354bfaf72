// RoPE: the YaRN / plain frequency tables against an independent double-precision
// formula and against literal values printed by transformers 5.23 (DeepseekV32
// RotaryEmbedding via /work/venv/bin/python), and the two rotations against a naive
// per-pair formula.
#include "kernels/rope/cpu.h"

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve {
namespace {

// DeepSeek-V3.2's rope_parameters, with qk_rope_head_dim = 64.
YarnParams deepseek_yarn() {
  YarnParams y;
  y.factor = 40.0;
  y.original_max_position_embeddings = 4096;
  y.beta_fast = 32.0;
  y.beta_slow = 1.0;
  y.mscale = 1.0;
  y.mscale_all_dim = 1.0;
  return y;
}

// YaRN inv_freq straight from the paper's definitions, in double.
std::vector<double> naive_yarn_inv_freq(int64_t dim, double theta, const YarnParams& y) {
  auto correction = [&](double rotations) {
    return dim * std::log(y.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction(y.beta_fast), high = correction(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;
  std::vector<double> out;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double base = 1.0 / std::pow(theta, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    // ramp 0: keep the original (high-frequency) pair; ramp 1: interpolate by factor.
    out.push_back(base * (1 - ramp) + base / y.factor * ramp);
  }
  return out;
}

TEST(Rope, YarnInvFreqMatchesTransformersLiterals) {
  // DeepseekV32RotaryEmbedding(config).inv_freq for the config above (float32 values).
  const double expected[32] = {1.0,
                               0.7498942017555237,
                               0.5623413324356079,
                               0.4216965138912201,
                               0.3162277638912201,
                               0.23713736236095428,
                               0.17782793939113617,
                               0.1333521455526352,
                               0.10000000149011612,
                               0.07498941570520401,
                               0.05623412877321243,
                               0.039006926119327545,
                               0.026879360899329185,
                               0.01837814413011074,
                               0.012447956018149853,
                               0.0083345090970397,
                               0.005500000435858965,
                               0.0035619973205029964,
                               0.002249365206807852,
                               0.0013705134624615312,
                               0.0007905694073997438,
                               0.0004149904125370085,
                               0.00017782794020604342,
                               3.333803397254087e-05,
                               2.499999936844688e-05,
                               1.8747354260995053e-05,
                               1.4058532542549074e-05,
                               1.0542412383074407e-05,
                               7.905694474175107e-06,
                               5.928434347879374e-06,
                               4.445698323252145e-06,
                               3.3338035336782923e-06};
  const RopeTable t = RopeTable::yarn(64, 10000.0, deepseek_yarn());
  ASSERT_EQ(t.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    // Within 2 ulp of float32: torch's and libm's powf may round differently.
    EXPECT_NEAR(t.inv_freq[i], expected[i], expected[i] * 2.4e-7) << "pair " << i;
  }
}

TEST(Rope, YarnScalesMatchTransformers) {
  // DeepSeek's config: mscale == mscale_all_dim, so cos/sin are unscaled and the softmax
  // scale takes mscale^2. transformers: DeepseekV32Attention.scaling = 0.19124944415602058
  // for qk_head_dim 96, RotaryEmbedding.attention_scaling = 1.0.
  const RopeTable t = RopeTable::yarn(64, 10000.0, deepseek_yarn());
  EXPECT_EQ(t.attention_factor, 1.0f);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(t.softmax_scale_factor, mscale * mscale);
  EXPECT_NEAR(std::pow(96.0, -0.5) * t.softmax_scale_factor, 0.19124944415602058, 1e-15);

  // mscale 0.707, mscale_all_dim 1: transformers' attention_factor 0.9210423553163399.
  YarnParams y = deepseek_yarn();
  y.mscale = 0.707;
  EXPECT_NEAR(RopeTable::yarn(64, 10000.0, y).attention_factor, 0.9210423553163399, 1e-7);

  // No mscale fields: attention_factor = get_mscale(factor) (1.138629436111989 for factor
  // 4, from transformers), no softmax factor.
  YarnParams plain_yarn;
  plain_yarn.factor = 4.0;
  plain_yarn.original_max_position_embeddings = 4096;
  const RopeTable t3 = RopeTable::yarn(64, 10000.0, plain_yarn);
  EXPECT_NEAR(t3.attention_factor, 1.138629436111989, 1e-7);
  EXPECT_EQ(t3.softmax_scale_factor, 1.0);
  // transformers' inv_freq[20], [31] for this config.
  EXPECT_NEAR(t3.inv_freq[20], 0.0013378867879509926, 0.0013378867879509926 * 2.4e-7);
  EXPECT_NEAR(t3.inv_freq[31], 3.333803761051968e-05, 3.333803761051968e-05 * 2.4e-7);

  // An explicit attention_factor wins.
  y.attention_factor = 0.5;
  EXPECT_EQ(RopeTable::yarn(64, 10000.0, y).attention_factor, 0.5f);
}

TEST(Rope, YarnInvFreqMatchesNaiveFormula) {
  struct Case {
    int64_t dim;
    double theta, factor;
    int64_t orig;
    bool truncate;
  };
  for (const Case c : {Case{64, 10000.0, 40.0, 4096, true}, Case{64, 50000.0, 4.0, 8192, true},
                       Case{32, 10000.0, 8.0, 2048, false}, Case{2, 10000.0, 2.0, 4096, true},
                       Case{128, 1e6, 16.0, 32768, false}}) {
    YarnParams y;
    y.factor = c.factor;
    y.original_max_position_embeddings = c.orig;
    y.truncate = c.truncate;
    const RopeTable t = RopeTable::yarn(c.dim, c.theta, y);
    const std::vector<double> ref = naive_yarn_inv_freq(c.dim, c.theta, y);
    for (int64_t i = 0; i < c.dim / 2; ++i) {
      EXPECT_NEAR(t.inv_freq[i], ref[i], ref[i] * 1e-6)
          << "dim " << c.dim << " theta " << c.theta << " pair " << i;
    }
  }
}

TEST(Rope, PlainInvFreq) {
  const RopeTable t = RopeTable::plain(64, 10000.0);
  EXPECT_EQ(t.attention_factor, 1.0f);
  EXPECT_EQ(t.softmax_scale_factor, 1.0);
  for (int i = 0; i < 32; ++i) {
    const double ref = std::pow(10000.0, -2.0 * i / 64);
    EXPECT_NEAR(t.inv_freq[i], ref, ref * 1e-6) << "pair " << i;
  }
}

TEST(Rope, RefusesBadTables) {
  EXPECT_THROW(RopeTable::plain(63, 10000.0), InvalidArgument);
  EXPECT_THROW(RopeTable::plain(0, 10000.0), InvalidArgument);
  EXPECT_THROW(RopeTable::yarn(64, 10000.0, YarnParams{}), InvalidArgument);  // no original len
}

// x = (j + 1) / 64 at position 1000, DeepSeek's YaRN table. transformers'
// apply_rotary_pos_emb_interleave rotates pairs (2i, 2i+1) and writes them de-interleaved
// ([all first | all second]); we keep DeepSeek's interleaved layout, so HF[i] is our
// [2i] and HF[i + 32] our [2i + 1]. apply_rotary_pos_emb (NeoX) keeps the layout.
TEST(Rope, RotationsMatchTransformersLiterals) {
  const RopeTable t = RopeTable::yarn(64, 10000.0, deepseek_yarn());
  std::vector<float> x(64);
  for (int j = 0; j < 64; ++j) x[j] = (j + 1) / 64.0f;
  const int64_t pos = 1000;
  std::vector<float> inter = x, neox = x;
  cpu::apply_rope_interleaved(t, {.x = inter.data(),
                                  .positions = &pos,
                                  .num_tokens = 1,
                                  .num_heads = 1,
                                  .head_stride = 64,
                                  .offset = 0});
  cpu::apply_rope_neox(t, {.x = neox.data(),
                           .positions = &pos,
                           .num_tokens = 1,
                           .num_heads = 1,
                           .head_stride = 64,
                           .offset = 0});
  struct Lit {
    int i;
    double first, second;
  };
  for (const Lit l : {Lit{0, -0.01705281436443329, 0.030494339764118195},
                      Lit{1, -0.0781107172369957, 0.0014938898384571075},
                      Lit{10, 0.41837599873542786, 0.2253699004650116},
                      Lit{31, 0.9810357093811035, 1.0032761096954346}}) {
    EXPECT_NEAR(inter[2 * l.i], l.first, 2e-6) << "pair " << l.i;
    EXPECT_NEAR(inter[2 * l.i + 1], l.second, 2e-6) << "pair " << l.i;
  }
  for (const Lit l : {Lit{0, -0.41757258772850037, 0.3028967082500458},
                      Lit{1, -0.4492858946323395, -0.2852109968662262},
                      Lit{10, 0.3713070750236511, 0.5857372283935547},
                      Lit{31, 0.4966634213924408, 1.0016613006591797}}) {
    EXPECT_NEAR(neox[l.i], l.first, 2e-6) << "pair " << l.i;
    EXPECT_NEAR(neox[l.i + 32], l.second, 2e-6) << "pair " << l.i;
  }
}

// Every head of every token, only dims [offset, offset + rotary_dim) rotated; the angle
// is float(pos) * inv_freq (fp32 product, as transformers forms it), the rest in double.
TEST(Rope, RotationsMatchNaiveFormula) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  YarnParams y = deepseek_yarn();
  y.mscale = 0.707;  // attention_factor != 1 exercises the cos/sin scaling
  for (const bool neox : {false, true}) {
    for (const int64_t num_tokens : {1, 3, 65}) {
      for (const int64_t num_heads : {1, 3}) {
        const RopeTable t = RopeTable::yarn(16, 10000.0, y);
        const int64_t stride = 23, offset = 5, half = 8;
        std::vector<float> x(num_tokens * num_heads * stride);
        for (float& v : x) v = dist(rng);
        std::vector<int64_t> pos(num_tokens);
        for (auto& p : pos) p = std::uniform_int_distribution<int64_t>(0, 200000)(rng);
        std::vector<float> got = x;
        const RopeParams params{.x = got.data(),
                                .positions = pos.data(),
                                .num_tokens = num_tokens,
                                .num_heads = num_heads,
                                .head_stride = stride,
                                .offset = offset};
        if (neox) {
          cpu::apply_rope_neox(t, params);
        } else {
          cpu::apply_rope_interleaved(t, params);
        }
        for (int64_t tok = 0; tok < num_tokens; ++tok) {
          for (int64_t h = 0; h < num_heads; ++h) {
            const int64_t base = (tok * num_heads + h) * stride;
            std::vector<double> ref(x.begin() + base, x.begin() + base + stride);
            for (int64_t i = 0; i < half; ++i) {
              const int64_t a = offset + (neox ? i : 2 * i),
                            b = offset + (neox ? i + half : 2 * i + 1);
              const double angle = static_cast<float>(pos[tok]) * t.inv_freq[i];
              const double c = std::cos(angle) * t.attention_factor;
              const double s = std::sin(angle) * t.attention_factor;
              ref[a] = x[base + a] * c - x[base + b] * s;
              ref[b] = x[base + b] * c + x[base + a] * s;
            }
            for (int64_t j = 0; j < stride; ++j) {
              if (j < offset || j >= offset + 2 * half) {
                EXPECT_EQ(got[base + j], x[base + j]) << "untouched dim " << j;
              } else {
                EXPECT_NEAR(got[base + j], ref[j], 1e-5)
                    << (neox ? "neox" : "interleaved") << " token " << tok << " head " << h
                    << " dim " << j;
              }
            }
          }
        }
      }
    }
  }
}

// With attention_factor 1, q.k after rotation depends only on the position difference.
TEST(Rope, DotDependsOnRelativePosition) {
  const RopeTable t = RopeTable::yarn(64, 10000.0, deepseek_yarn());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(64), k(64);
  for (float& v : q) v = dist(rng);
  for (float& v : k) v = dist(rng);
  auto rotated_dot = [&](int64_t qp, int64_t kp) {
    std::vector<float> a = q, b = k;
    cpu::apply_rope_interleaved(t, {.x = a.data(),
                                    .positions = &qp,
                                    .num_tokens = 1,
                                    .num_heads = 1,
                                    .head_stride = 64,
                                    .offset = 0});
    cpu::apply_rope_interleaved(t, {.x = b.data(),
                                    .positions = &kp,
                                    .num_tokens = 1,
                                    .num_heads = 1,
                                    .head_stride = 64,
                                    .offset = 0});
    double d = 0;
    for (int i = 0; i < 64; ++i) d += static_cast<double>(a[i]) * b[i];
    return d;
  };
  EXPECT_NEAR(rotated_dot(10, 3), rotated_dot(1007, 1000), 1e-4);
  EXPECT_NEAR(rotated_dot(5, 5), rotated_dot(0, 0), 1e-4);
}

TEST(Rope, RefusesDimsOutsideTheHead) {
  const RopeTable t = RopeTable::plain(8, 10000.0);
  std::vector<float> x(10);
  const int64_t pos = 0;
  EXPECT_THROW(cpu::apply_rope_interleaved(t, {.x = x.data(),
                                               .positions = &pos,
                                               .num_tokens = 1,
                                               .num_heads = 1,
                                               .head_stride = 10,
                                               .offset = 3}),
               InvalidArgument);
  EXPECT_NO_THROW(cpu::apply_rope_neox(t, {.x = x.data(),
                                           .positions = &pos,
                                           .num_tokens = 1,
                                           .num_heads = 1,
                                           .head_stride = 10,
                                           .offset = 2}));
}

}  // namespace
}  // namespace hyserve
