// The MoE router (grouped top-k on hand-made scores, tie rule, bias, renormalize,
// scaling; random inputs against a naive reference) and the expert combination
// against a naive per-token double loop.
#include "kernels/moe/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace hyserve::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

struct RouterCase {
  std::vector<float> logits = {};  // [T, E]
  std::vector<float> bias = {};    // [E] or empty
  int64_t num_experts = 0;
  int64_t top_k = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool renormalize = false;
  float scaling_factor = 1.0f;
};

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// The gate is the identity, so x gate^T reproduces the given logits exactly.
Routed route(const RouterCase& c) {
  const int64_t e = c.num_experts;
  const int64_t num_tokens = static_cast<int64_t>(c.logits.size()) / e;
  std::vector<float> identity(e * e, 0.0f);
  for (int64_t i = 0; i < e; ++i) identity[i * e + i] = 1.0f;
  const Weight gate{.dtype = DType::kF32, .rows = e, .cols = e, .data = identity.data()};
  Routed r{std::vector<int32_t>(num_tokens * c.top_k, -1),
           std::vector<float>(num_tokens * c.top_k, NAN)};
  route_experts({.x = c.logits.data(),
                 .gate = &gate,
                 .bias = c.bias.empty() ? nullptr : c.bias.data(),
                 .num_tokens = num_tokens,
                 .num_experts = e,
                 .top_k = c.top_k,
                 .n_group = c.n_group,
                 .topk_group = c.topk_group,
                 .renormalize = c.renormalize,
                 .scaling_factor = c.scaling_factor,
                 .expert_ids = r.ids.data(),
                 .expert_weights = r.weights.data()});
  return r;
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

TEST(Router, GroupedTopKExcludesWeakGroups) {
  // Groups of 2. Expert 0 is the best single expert, but its group's top-2 sum
  // (0.98 + 0.0003) loses to groups 1 (0.73 + 0.73) and 2 (0.62 + 0.62).
  RouterCase c{.logits = {4, -8, 1, 1, 0.5f, 0.5f, -3, -3},
               .num_experts = 8,
               .top_k = 3,
               .n_group = 4,
               .topk_group = 2};
  Routed r = route(c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3, 4}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(r.weights[i], sigmoid(c.logits[r.ids[i]]), 1e-6) << "slot " << i;
  }
  c.n_group = 1;
  c.topk_group = 1;
  r = route(c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2, 3}));
}

TEST(Router, TiesGoToTheLowerIndex) {
  RouterCase flat{.logits = std::vector<float>(8, 0.0f), .num_experts = 8, .top_k = 3};
  EXPECT_EQ(route(flat).ids, (std::vector<int32_t>{0, 1, 2}));
  flat.n_group = 4;
  flat.topk_group = 2;
  flat.top_k = 4;
  EXPECT_EQ(route(flat).ids, (std::vector<int32_t>{0, 1, 2, 3}));
  // Groups 1 and 2 tie for second place: group 1 is kept. Experts 0 and 1 tie: 0 first.
  const RouterCase groups{.logits = {2, 2, 1, 0, 0, 1, -1, -1},
                          .num_experts = 8,
                          .top_k = 3,
                          .n_group = 4,
                          .topk_group = 2};
  EXPECT_EQ(route(groups).ids, (std::vector<int32_t>{0, 1, 2}));
}

TEST(Router, BiasSelectsButDoesNotWeigh) {
  // s = {.5, .75, .5, .5}; s' = {.5, .75, .5, .8}: experts 3 then 1, weighted .5 and .75.
  RouterCase c{.logits = {0, std::log(3.0f), 0, 0},
               .bias = {0, 0, 0, 0.3f},
               .num_experts = 4,
               .top_k = 2,
               .scaling_factor = 2.0f};
  Routed r = route(c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.weights[0], 1.0, 1e-6);
  EXPECT_NEAR(r.weights[1], 1.5, 1e-6);
  c.renormalize = true;
  r = route(c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.weights[0], 0.5 / 1.25 * 2.0, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.75 / 1.25 * 2.0, 1e-6);
}

// Naive reference: double scores, stable sorts (stable = lower index first on ties).
Routed naive_route(const std::vector<float>& x, const std::vector<float>& gate,
                   const std::vector<float>& bias, int64_t num_tokens, int64_t hidden,
                   const RouterCase& c) {
  const int64_t e = c.num_experts, group_size = e / c.n_group;
  Routed r;
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<double> s(e), sel(e);
    for (int64_t j = 0; j < e; ++j) {
      double logit = 0;
      for (int64_t d = 0; d < hidden; ++d)
        logit += double(x[t * hidden + d]) * gate[j * hidden + d];
      s[j] = sigmoid(logit);
      sel[j] = s[j] + bias[j];
    }
    std::vector<double> group_score(c.n_group);
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<double> members(sel.begin() + g * group_size, sel.begin() + (g + 1) * group_size);
      std::sort(members.begin(), members.end(), std::greater<>());
      group_score[g] = c.n_group == 1 ? 0.0 : members[0] + members[1];
    }
    std::vector<int64_t> groups(c.n_group);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
    std::vector<int64_t> experts;
    for (int64_t j = 0; j < e; ++j) {
      if (std::find(groups.begin(), groups.begin() + c.topk_group, j / group_size) !=
          groups.begin() + c.topk_group) {
        experts.push_back(j);
      }
    }
    std::stable_sort(experts.begin(), experts.end(),
                     [&](int64_t a, int64_t b) { return sel[a] > sel[b]; });
    double sum = 0;
    for (int64_t i = 0; i < c.top_k; ++i) sum += s[experts[i]];
    for (int64_t i = 0; i < c.top_k; ++i) {
      r.ids.push_back(static_cast<int32_t>(experts[i]));
      const double w = c.renormalize ? s[experts[i]] / (sum + 1e-20) : s[experts[i]];
      r.weights.push_back(static_cast<float>(w * c.scaling_factor));
    }
  }
  return r;
}

TEST(Router, MatchesNaiveReferenceOnRandomInputs) {
  std::mt19937 rng(40);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t hidden = 33, num_experts = 16;
  for (int64_t num_tokens : {1, 3, 63, 65}) {
    for (auto [n_group, topk_group] : {std::pair<int64_t, int64_t>{1, 1}, {4, 2}, {8, 3}}) {
      for (int64_t top_k : {1, 4}) {
        for (bool renormalize : {false, true}) {
          std::vector<float> x(num_tokens * hidden), gate(num_experts * hidden), bias(num_experts);
          for (auto& v : x) v = dist(rng);
          for (auto& v : gate) v = dist(rng) * 0.3f;
          for (auto& v : bias) v = dist(rng) * 0.1f;
          const Weight w{
              .dtype = DType::kF32, .rows = num_experts, .cols = hidden, .data = gate.data()};
          const RouterCase c{.num_experts = num_experts,
                             .top_k = top_k,
                             .n_group = n_group,
                             .topk_group = topk_group,
                             .renormalize = renormalize,
                             .scaling_factor = 2.5f};
          std::vector<int32_t> ids(num_tokens * top_k);
          std::vector<float> weights(num_tokens * top_k);
          route_experts({.x = x.data(),
                         .gate = &w,
                         .bias = bias.data(),
                         .num_tokens = num_tokens,
                         .num_experts = num_experts,
                         .top_k = top_k,
                         .n_group = n_group,
                         .topk_group = topk_group,
                         .renormalize = renormalize,
                         .scaling_factor = 2.5f,
                         .expert_ids = ids.data(),
                         .expert_weights = weights.data()});
          const Routed ref = naive_route(x, gate, bias, num_tokens, hidden, c);
          const std::string what = "T " + std::to_string(num_tokens) + " groups " +
                                   std::to_string(n_group) + "/" + std::to_string(topk_group) +
                                   " top_k " + std::to_string(top_k) + " renorm " +
                                   std::to_string(renormalize);
          ASSERT_EQ(ids, ref.ids) << what;
          for (size_t i = 0; i < weights.size(); ++i) {
            ASSERT_NEAR(weights[i], ref.weights[i], 1e-5 * std::fabs(ref.weights[i]))
                << what << " slot " << i;
          }
        }
      }
    }
  }
}

TEST(Router, RejectsImpossibleGrouping) {
  RouterCase c{.logits = std::vector<float>(8, 0.0f), .num_experts = 8, .top_k = 2};
  c.n_group = 3;  // 8 % 3 != 0
  EXPECT_THROW(route(c), InvalidArgument);
  c.n_group = 4;
  c.topk_group = 5;  // more groups kept than exist
  EXPECT_THROW(route(c), InvalidArgument);
  c.topk_group = 1;
  c.top_k = 3;  // only 2 experts in the one kept group
  EXPECT_THROW(route(c), InvalidArgument);
  c.n_group = 8;  // groups of one expert have no top-2
  c.top_k = 1;
  EXPECT_THROW(route(c), InvalidArgument);
}

// Owns one expert's dense F32 matrices. Move only: w points into the vectors.
struct TestMlp {
  std::vector<float> gate, up, down;
  MlpWeights w;
  TestMlp() = default;
  TestMlp(TestMlp&&) = default;
  TestMlp(const TestMlp&) = delete;
  TestMlp& operator=(TestMlp&&) = default;
};

TestMlp random_mlp(int64_t hidden, int64_t inter, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  TestMlp m;
  for (auto* v : {&m.gate, &m.up, &m.down}) {
    v->resize(hidden * inter);
    for (auto& x : *v) x = dist(rng) * 0.3f;
  }
  m.w.gate = {.dtype = DType::kF32, .rows = inter, .cols = hidden, .data = m.gate.data()};
  m.w.up = {.dtype = DType::kF32, .rows = inter, .cols = hidden, .data = m.up.data()};
  m.w.down = {.dtype = DType::kF32, .rows = hidden, .cols = inter, .data = m.down.data()};
  return m;
}

// y += scale * mlp(x) in double; mag += |scale| * sum |h * down| (the error scale).
void naive_mlp(const TestMlp& m, int64_t hidden, int64_t inter, const float* x, double scale,
               double* y, double& mag) {
  std::vector<double> h(inter);
  for (int64_t i = 0; i < inter; ++i) {
    double g = 0, u = 0;
    for (int64_t d = 0; d < hidden; ++d) {
      g += double(x[d]) * m.gate[i * hidden + d];
      u += double(x[d]) * m.up[i * hidden + d];
    }
    h[i] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t d = 0; d < hidden; ++d) {
    for (int64_t i = 0; i < inter; ++i) {
      y[d] += scale * h[i] * m.down[d * inter + i];
      mag += std::fabs(scale * h[i] * m.down[d * inter + i]);
    }
  }
}

struct MoeCase {
  int64_t hidden, inter, num_experts, num_tokens, top_k;
  bool with_shared;
};

struct MoeData {
  std::vector<TestMlp> experts_owned;
  std::vector<MlpWeights> experts;
  TestMlp shared;
  std::vector<float> x, weights;
  std::vector<int32_t> ids;
};

MoeData make_moe(const MoeCase& c, std::mt19937& rng) {
  MoeData m;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    m.experts_owned.push_back(random_mlp(c.hidden, c.inter, rng));
  }
  for (const auto& e : m.experts_owned) m.experts.push_back(e.w);
  m.shared = random_mlp(c.hidden, c.inter, rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::uniform_real_distribution<float> wdist(0.1f, 2.0f);
  m.x.resize(c.num_tokens * c.hidden);
  for (auto& v : m.x) v = dist(rng);
  std::vector<int32_t> perm(c.num_experts);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < c.top_k; ++i) {
      m.ids.push_back(perm[i]);
      m.weights.push_back(wdist(rng));
    }
  }
  return m;
}

void run_moe(const MoeCase& c, const MoeData& m, const float* x, int64_t num_tokens,
             const int32_t* ids, const float* weights, float* y) {
  moe({.x = x,
       .num_tokens = num_tokens,
       .hidden = c.hidden,
       .experts = m.experts.data(),
       .num_experts = c.num_experts,
       .expert_ids = ids,
       .expert_weights = weights,
       .top_k = c.top_k,
       .shared = c.with_shared ? &m.shared.w : nullptr,
       .y = y,
       .act = {}});
}

TEST(Moe, MatchesNaiveLoop) {
  std::mt19937 rng(41);
  for (int64_t hidden : {3, 65}) {
    for (int64_t num_tokens : {1, 3, 63, 65}) {
      for (int64_t top_k : {1, 3}) {
        for (bool with_shared : {false, true}) {
          const MoeCase c{hidden, 7, 5, num_tokens, top_k, with_shared};
          const MoeData m = make_moe(c, rng);
          std::vector<float> y(num_tokens * hidden, NAN);
          run_moe(c, m, m.x.data(), num_tokens, m.ids.data(), m.weights.data(), y.data());
          // Error budget: a few roundings per product in the dot products of both layers.
          double worst = 0.0;
          int64_t worst_i = -1;
          for (int64_t t = 0; t < num_tokens; ++t) {
            std::vector<double> ref(hidden, 0.0);
            double mag = 0.0;
            for (int64_t i = 0; i < top_k; ++i) {
              naive_mlp(m.experts_owned[m.ids[t * top_k + i]], hidden, c.inter,
                        m.x.data() + t * hidden, m.weights[t * top_k + i], ref.data(), mag);
            }
            if (with_shared) {
              naive_mlp(m.shared, hidden, c.inter, m.x.data() + t * hidden, 1.0, ref.data(), mag);
            }
            const double tol = 16 * (hidden + c.inter) * kU * mag + 1e-30;
            for (int64_t d = 0; d < hidden; ++d) {
              const double ratio = std::fabs(y[t * hidden + d] - ref[d]) / tol;
              if (!(ratio <= worst)) {
                worst = ratio;
                worst_i = t * hidden + d;
              }
            }
          }
          EXPECT_LE(worst, 1.0) << "D " << hidden << " T " << num_tokens << " top_k " << top_k
                                << " shared " << with_shared << ": worst element " << worst_i;
        }
      }
    }
  }
}

TEST(Moe, BatchInvariantAndInPlace) {
  std::mt19937 rng(42);
  const MoeCase c{65, 7, 5, 65, 3, true};
  const MoeData m = make_moe(c, rng);
  std::vector<float> y(c.num_tokens * c.hidden);
  run_moe(c, m, m.x.data(), c.num_tokens, m.ids.data(), m.weights.data(), y.data());
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    std::vector<float> alone(m.x.begin() + t * c.hidden, m.x.begin() + (t + 1) * c.hidden);
    run_moe(c, m, alone.data(), 1, m.ids.data() + t * c.top_k, m.weights.data() + t * c.top_k,
            alone.data());
    ASSERT_EQ(std::memcmp(alone.data(), y.data() + t * c.hidden, c.hidden * sizeof(float)), 0)
        << "token " << t;
  }
}

TEST(Moe, ExpertParallelRanksSumToTheWholeMoe) {
  // 6 experts over 2 and 3 ranks: each rank runs its experts only (the others' slots add
  // nothing); the ranks' outputs sum to the whole MoE's within float reassociation.
  std::mt19937 rng(44);
  const MoeCase c{65, 7, 6, 63, 3, false};
  const MoeData m = make_moe(c, rng);
  std::vector<float> whole(c.num_tokens * c.hidden);
  run_moe(c, m, m.x.data(), c.num_tokens, m.ids.data(), m.weights.data(), whole.data());
  for (const int64_t ranks : {2, 3}) {
    const int64_t count = c.num_experts / ranks;
    std::vector<float> sum(whole.size(), 0.0f), y(whole.size());
    for (int64_t r = 0; r < ranks; ++r) {
      moe({.x = m.x.data(),
           .num_tokens = c.num_tokens,
           .hidden = c.hidden,
           .experts = m.experts.data() + r * count,
           .num_experts = count,
           .expert_ids = m.ids.data(),
           .expert_weights = m.weights.data(),
           .top_k = c.top_k,
           .y = y.data(),
           .act = {},
           .local_experts_only = true,
           .expert_offset = r * count});
      for (size_t i = 0; i < y.size(); ++i) sum[i] += y[i];
    }
    double scale = 0;
    for (float v : whole) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_NEAR(sum[i], whole[i], 1e-5 * scale) << ranks << " ranks, element " << i;
    }
  }
}

TEST(Moe, RejectsOutOfRangeExpertId) {
  std::mt19937 rng(43);
  const MoeCase c{3, 7, 5, 2, 1, false};
  MoeData m = make_moe(c, rng);
  std::vector<float> y(c.num_tokens * c.hidden);
  for (int32_t bad : {5, -1}) {
    m.ids[1] = bad;
    EXPECT_THROW(run_moe(c, m, m.x.data(), c.num_tokens, m.ids.data(), m.weights.data(), y.data()),
                 InvalidArgument);
  }
}

}  // namespace
}  // namespace hyserve::cpu
