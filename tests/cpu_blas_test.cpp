// The CPU backend's GEMMs through OpenBLAS (CpuGemm::kBlas, kernels/linear/params.h): every
// weight format within the fp32 summation bound of double math, as the reference is; calls of
// few tokens, and every call in batch-invariant mode, bitwise the reference; the MLP, the MoE
// and a whole model close to the reference. The BLAS cases skip themselves in a build without
// OpenBLAS (HYSERVE_BLAS=OFF), where kBlas is the reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "kernels/linear/params.h"
#include "kernels/mlp/params.h"
#include "kernels/moe/params.h"
#include "model/model.h"
#include "quantized_weights.h"

namespace hyserve {
namespace {

using test::Format;
using test::format_name;
using test::quantize;

using test::decode;
using test::random_vector;

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Any order of an fp32 sum of n terms (with or without fused multiply-adds) is within
// (n + 2) * 2^-24 * sum |terms| of the exact sum: the bound the reference meets
// (linear_test.cpp), which sgemm must meet too.
TEST(CpuBlas, LinearMeetsTheFp32SummationBoundForEveryFormat) {
  if (!cpu::blas_linked()) GTEST_SKIP() << "built without OpenBLAS";
  std::mt19937 rng(41);
  for (Format f : test::kAllFormats) {
    const std::vector<int64_t> all_cols =
        test::needs_cols_of_32(f) ? std::vector<int64_t>{32, 160} : std::vector<int64_t>{3, 200};
    for (int64_t rows : {1, 130, 257}) {
      for (int64_t cols : all_cols) {
        // 4: the fewest tokens kBlas hands to sgemm; 200 over one row block: split by tokens.
        for (int64_t num_tokens : {cpu::kBlasMinTokens, int64_t{37}, int64_t{200}}) {
          const bool with_bias = (rows + num_tokens) % 2 == 1;
          const test::HostWeight t = quantize(random_vector(rows * cols, rng), rows, cols, f);
          const auto x = random_vector(num_tokens * cols, rng);
          const auto bias = random_vector(rows, rng);
          std::vector<float> y(num_tokens * rows, NAN);
          cpu::linear({.x = x.data(),
                       .w = &t.w,
                       .y = y.data(),
                       .num_tokens = num_tokens,
                       .bias = with_bias ? bias.data() : nullptr},
                      cpu::CpuGemm::kBlas);
          const auto w = decode(t.w);
          double worst = 0.0;
          for (int64_t tok = 0; tok < num_tokens; ++tok) {
            for (int64_t r = 0; r < rows; ++r) {
              double ref = with_bias ? bias[r] : 0.0;
              double mag = std::fabs(ref);
              for (int64_t c = 0; c < cols; ++c) {
                const double term = static_cast<double>(x[tok * cols + c]) * w[r * cols + c];
                ref += term;
                mag += std::fabs(term);
              }
              const double tol = (cols + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
              const double ratio = std::fabs(y[tok * rows + r] - ref) / tol;
              worst = std::isnan(ratio) ? INFINITY : std::max(worst, ratio);
            }
          }
          EXPECT_LE(worst, 1.0) << format_name(f) << " rows " << rows << " cols " << cols
                                << " tokens " << num_tokens << " bias " << with_bias;
        }
      }
    }
  }
}

TEST(CpuBlas, FewTokensTakeTheReferenceBitForBit) {
  std::mt19937 rng(42);
  const int64_t rows = 70, cols = 96;
  const test::HostWeight t = quantize(random_vector(rows * cols, rng), rows, cols, Format::kBF16);
  for (int64_t num_tokens = 1; num_tokens < cpu::kBlasMinTokens; ++num_tokens) {
    const auto x = random_vector(num_tokens * cols, rng);
    std::vector<float> ref(num_tokens * rows), blas(num_tokens * rows);
    cpu::linear({.x = x.data(), .w = &t.w, .y = ref.data(), .num_tokens = num_tokens});
    cpu::linear({.x = x.data(), .w = &t.w, .y = blas.data(), .num_tokens = num_tokens},
                cpu::CpuGemm::kBlas);
    EXPECT_TRUE(bitwise_equal(ref, blas)) << num_tokens << " tokens";
  }
}

// The backend runs what set_cpu_gemm asks, but the reference whenever it is batch invariant.
TEST(CpuBlas, BackendTakesTheReferenceInBatchInvariantMode) {
  std::mt19937 rng(43);
  const int64_t rows = 150, cols = 64, num_tokens = 40;
  const test::HostWeight t = quantize(random_vector(rows * cols, rng), rows, cols, Format::kF32);
  const auto x = random_vector(num_tokens * cols, rng);
  const LinearParams p{.x = x.data(), .w = &t.w, .y = nullptr, .num_tokens = num_tokens};
  const auto run = [&](auto&& fn) {
    std::vector<float> y(num_tokens * rows, NAN);
    LinearParams q = p;
    q.y = y.data();
    fn(q);
    return y;
  };
  const auto ref = run([](const LinearParams& q) { cpu::linear(q); });
  const auto blas = run([](const LinearParams& q) { cpu::linear(q, cpu::CpuGemm::kBlas); });
  const auto backend = make_cpu_backend();
  const auto on_backend = [&] { return run([&](const LinearParams& q) { backend->linear(q); }); };
  EXPECT_TRUE(bitwise_equal(on_backend(), ref)) << "default: the reference";
  backend->set_cpu_gemm(cpu::CpuGemm::kBlas);
  EXPECT_TRUE(bitwise_equal(on_backend(), blas)) << "kBlas";
  backend->set_batch_invariant(true);
  EXPECT_TRUE(bitwise_equal(on_backend(), ref)) << "kBlas, batch invariant";
  backend->set_batch_invariant(false);
  EXPECT_TRUE(bitwise_equal(on_backend(), blas)) << "kBlas again";
  backend->set_cpu_gemm(cpu::CpuGemm::kReference);
  EXPECT_TRUE(bitwise_equal(on_backend(), ref)) << "kReference";
  if (cpu::blas_linked()) {
    EXPECT_FALSE(bitwise_equal(ref, blas)) << "sgemm took no call";
  }
}

// max |got - want| <= rel * max |want|.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0.0, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(double{want[i]}));
    err = std::max(err, std::fabs(double{got[i]} - want[i]));
  }
  EXPECT_LE(err, rel * scale) << what << ": max error " << err << " of max " << scale;
}

// The MLP and the MoE (experts with many tokens and with few, a shared expert) with kBlas:
// within 1e-5 of the output's scale of the reference (three fp32 GEMMs of <= 256 terms).
TEST(CpuBlas, MlpAndMoeCloseToTheReference) {
  std::mt19937 rng(44);
  const int64_t hidden = 96, inter = 160, num_experts = 4, top_k = 2, num_tokens = 50;
  std::vector<test::HostWeight> storage;
  const auto make_mlp = [&] {
    MlpWeights m;
    storage.push_back(
        quantize(random_vector(inter * hidden, rng, 0.1f), inter, hidden, Format::kBF16));
    m.gate = storage.back().w;
    storage.push_back(
        quantize(random_vector(inter * hidden, rng, 0.1f), inter, hidden, Format::kFp8F32Scales));
    m.up = storage.back().w;
    storage.push_back(
        quantize(random_vector(hidden * inter, rng, 0.1f), hidden, inter, Format::kMxfp4));
    m.down = storage.back().w;
    return m;
  };
  storage.reserve(3 * (num_experts + 1));
  std::vector<MlpWeights> experts;
  for (int64_t e = 0; e < num_experts; ++e) experts.push_back(make_mlp());
  const MlpWeights shared = make_mlp();
  const auto x = random_vector(num_tokens * hidden, rng);

  std::vector<float> mlp_ref(num_tokens * hidden), mlp_blas(num_tokens * hidden);
  const MlpParams mp{
      .x = x.data(), .w = &shared, .y = mlp_ref.data(), .num_tokens = num_tokens, .act = {}};
  cpu::mlp(mp);
  MlpParams mp_blas = mp;
  mp_blas.y = mlp_blas.data();
  cpu::mlp(mp_blas, cpu::CpuGemm::kBlas);
  expect_close(mlp_blas, mlp_ref, 1e-5, "mlp");

  // Expert 0 gets most tokens, expert 3 one (below kBlasMinTokens: the reference).
  std::vector<int32_t> ids(num_tokens * top_k);
  std::vector<float> weights(num_tokens * top_k);
  for (int64_t t = 0; t < num_tokens; ++t) {
    ids[t * top_k] = t == 7 ? 3 : 0;
    ids[t * top_k + 1] = 1 + static_cast<int32_t>(t % 2);
    weights[t * top_k] = 0.7f;
    weights[t * top_k + 1] = 0.3f;
  }
  std::vector<float> moe_ref(num_tokens * hidden), moe_blas(num_tokens * hidden);
  MoeParams moe{.x = x.data(),
                .num_tokens = num_tokens,
                .hidden = hidden,
                .experts = experts.data(),
                .num_experts = num_experts,
                .expert_ids = ids.data(),
                .expert_weights = weights.data(),
                .top_k = top_k,
                .shared = &shared,
                .y = moe_ref.data(),
                .act = {}};
  cpu::moe(moe);
  moe.y = moe_blas.data();
  cpu::moe(moe, cpu::CpuGemm::kBlas);
  expect_close(moe_blas, moe_ref, 1e-5, "moe");
}

// The bundled model's logits over a 300-token prompt with kBlas: within 1e-4 of the logits'
// scale of the reference's (fp32 through every layer), and the same top token wherever the
// reference's top two are apart by more than that.
TEST(CpuBlas, BundledModelLogitsCloseToTheReference) {
  const auto dir = std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3";
  ModelOptions blas_options;
  blas_options.cpu_gemm = cpu::CpuGemm::kBlas;
  const auto ref_model = Model::load(dir);
  const auto blas_model = Model::load(dir, blas_options);
  const int64_t vocab = ref_model->config().vocab_size;
  std::mt19937 rng(45);
  std::vector<int32_t> prompt(300);
  for (auto& id : prompt) id = static_cast<int32_t>(rng() % vocab);
  std::vector<float> ref, blas;
  SequenceState ref_state = ref_model->new_sequence(), blas_state = blas_model->new_sequence();
  ref_model->forward(prompt, ref_state, ref, /*all_positions=*/true);
  blas_model->forward(prompt, blas_state, blas, /*all_positions=*/true);
  expect_close(blas, ref, 1e-4, "logits");
  double scale = 0.0;
  for (float v : ref) scale = std::max(scale, std::fabs(double{v}));
  int64_t compared = 0;
  for (size_t pos = 0; pos < prompt.size(); ++pos) {
    const float* r = ref.data() + pos * vocab;
    const float* b = blas.data() + pos * vocab;
    std::vector<float> row(r, r + vocab);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
    if (row[0] - row[1] <= 1e-4 * scale) continue;
    ++compared;
    EXPECT_EQ(std::max_element(b, b + vocab) - b, std::max_element(r, r + vocab) - r)
        << "position " << pos;
  }
  EXPECT_GT(compared, 250);
}

}  // namespace
}  // namespace hyserve
