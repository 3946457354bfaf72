// CUDA MoE router and grouped experts against the CPU ops.
//
// Router: x and the gate hold small multiples of powers of two, so every logit is
// exact in fp32 whatever the summation order; ties are frequent (equal logits) and
// must go to the lower index as on the CPU. Ids must match exactly; weights to
// rel 1e-6 (expf vs the host exp, 2 ulp).
// Experts: the routing (ids, weights) is made here and uploaded, so both sides run the
// same assignment. Experts with < 16 tokens take the decode kernels (BF16, FP8, MXFP4;
// fp32 activations as three bf16 terms) or the fp32 GEMV path: abs 2e-5, rel 1e-4 against
// the CPU. Experts with more tokens take the prefill kernels' warpgroup MMAs (BF16, FP8,
// MXFP4; hidden and inter multiples of 64) or else mma bf16 tiles (F32 / F16 / INT4
// weights too), x and act(gate, up) rounded to bf16: abs 1e-2 * max|y|, rel 1e-2.
// SiTU experts: see SituMatchesCpuMxfp4AndBf16.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "gpu/moe_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/moe/cuda.h"

namespace hyserve {
namespace {

using test::Format;

using test::Experts;
using test::make_experts;
using test::mixed_routing;
using test::random_routing;
using test::Routing;
using test::run_gpu;
using test::Shape;
using test::Stream;

// ---- router ----

struct RouterCase {
  int64_t tokens, hidden, experts, top_k, n_group, topk_group;
  bool bias, renormalize;
  float scaling;
};

TEST(GpuRouter, MatchesCpuIdsExactlyWithTies) {
  REQUIRE_GPU();
  const RouterCase cases[] = {
      {0, 64, 16, 2, 1, 1, false, false, 1.0f}, {1, 64, 16, 1, 1, 1, false, true, 1.0f},
      {3, 65, 64, 6, 8, 3, true, true, 2.5f},   {63, 64, 16, 4, 4, 2, true, true, 1.0f},
      {65, 64, 64, 8, 1, 1, false, true, 1.0f}, {321, 33, 32, 3, 4, 1, true, false, 0.5f},
      {17, 128, 256, 8, 8, 4, true, true, 2.5f}};
  uint64_t seed = 1;
  for (const RouterCase& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.tokens) + " E=" + std::to_string(c.experts) +
                 " top_k=" + std::to_string(c.top_k) + " groups=" + std::to_string(c.n_group));
    std::mt19937_64 rng(seed++);
    // At least one element each, so that the CPU op gets non-null pointers for T = 0.
    std::vector<float> x(std::max<int64_t>(c.tokens * c.hidden, 1)), gate(c.experts * c.hidden),
        bias(c.experts);
    for (float& v : x) v = 0.5f * static_cast<float>(static_cast<int>(rng() % 5) - 2);
    for (float& v : gate) v = static_cast<float>(static_cast<int>(rng() % 5) - 2) / 256.0f;
    for (float& v : bias) v = static_cast<float>(static_cast<int>(rng() % 33) - 16) / 64.0f;
    const test::HostWeight gw = test::quantize(gate, c.experts, c.hidden, Format::kBF16);
    RouterParams p{.gate = &gw.w,
                   .num_tokens = c.tokens,
                   .num_experts = c.experts,
                   .top_k = c.top_k,
                   .n_group = c.n_group,
                   .topk_group = c.topk_group,
                   .renormalize = c.renormalize,
                   .scaling_factor = c.scaling};
    std::vector<int32_t> want_ids(std::max<int64_t>(c.tokens * c.top_k, 1));
    std::vector<float> want_w(want_ids.size());
    p.x = x.data();
    p.bias = c.bias ? bias.data() : nullptr;
    p.expert_ids = want_ids.data();
    p.expert_weights = want_w.data();
    if (c.tokens > 0) cpu::route_experts(p);  // the CPU op refuses T = 0 (null logits)

    const cuda::DeviceWeight dg = cuda::DeviceWeight::upload(gw.w);
    const cuda::DeviceBuffer dx = cuda::to_device(x);
    const cuda::DeviceBuffer db = cuda::to_device(bias);
    cuda::DeviceBuffer ids(want_ids.size() * 4 + 4), weights(want_w.size() * 4 + 4);
    cuda::DeviceBuffer ws(cuda::router_workspace_bytes(c.tokens, c.experts, c.hidden) + 4);
    p.x = dx.as<float>();
    p.gate = &dg.view();
    p.bias = c.bias ? db.as<float>() : nullptr;
    p.expert_ids = ids.as<int32_t>();
    p.expert_weights = weights.as<float>();
    const auto n = static_cast<size_t>(c.tokens * c.top_k);
    want_ids.resize(n);
    want_w.resize(n);
    // The GEMV logits, then (past 16 tokens) the tensor-core logits on x's bf16 terms.
    Stream stream;
    cuda::Blas blas(stream.s);
    for (const cuda::Blas* b : std::vector<const cuda::Blas*>{nullptr, &blas}) {
      SCOPED_TRACE(b != nullptr ? "cuBLAS" : "GEMV");
      cuda::route_experts(p, ws.data(), ws.size(), stream.s, b);
      CUDA_CHECK(cudaStreamSynchronize(stream.s));
      EXPECT_EQ(cuda::to_host<int32_t>(ids, n), want_ids);
      EXPECT_TRUE(test::all_close(cuda::to_host<float>(weights, n), want_w, 0.0f, 1e-6f));
    }
  }
}

// The tensor-core logits (past 16 tokens) on fp32 activations that bf16 cannot hold: the
// three bf16 terms keep x exact, so the logits match an fp64 reference to fp32 summation
// error (a single bf16 rounding of x would be off by ~2^-9 relative), and the chosen experts
// equal the GEMV path's wherever the two best-scored candidates are not within that error.
TEST(GpuRouter, TensorCoreLogitsKeepFp32Activations) {
  REQUIRE_GPU();
  const int64_t tokens = 300, hidden = 512, experts = 64, top_k = 6;
  const std::vector<float> x = test::random_floats(tokens * hidden, 71, -3.0f, 3.0f);
  const std::vector<float> gate_f = test::random_floats(experts * hidden, 72, -0.05f, 0.05f);
  const test::HostWeight gw = test::quantize(gate_f, experts, hidden, Format::kBF16);
  std::vector<float> gate(gate_f.size());
  for (int64_t e = 0; e < experts; ++e) gw.w.dequantize_row(e, gate.data() + e * hidden);
  const cuda::DeviceWeight dg = cuda::DeviceWeight::upload(gw.w);
  const cuda::DeviceBuffer dx = cuda::to_device(x);
  cuda::DeviceBuffer ids(tokens * top_k * 4), weights(tokens * top_k * 4);
  cuda::DeviceBuffer ws(cuda::router_workspace_bytes(tokens, experts, hidden));
  RouterParams p{.x = dx.as<float>(),
                 .gate = &dg.view(),
                 .num_tokens = tokens,
                 .num_experts = experts,
                 .top_k = top_k,
                 .expert_ids = ids.as<int32_t>(),
                 .expert_weights = weights.as<float>()};
  Stream stream;
  cuda::Blas blas(stream.s);
  std::vector<std::vector<int32_t>> got_ids;
  for (const cuda::Blas* b : std::vector<const cuda::Blas*>{nullptr, &blas}) {
    cuda::route_experts(p, ws.data(), ws.size(), stream.s, b);
    CUDA_CHECK(cudaStreamSynchronize(stream.s));
    got_ids.push_back(cuda::to_host<int32_t>(ids, static_cast<size_t>(tokens * top_k)));
    // The logits the selection used are the workspace's first [T, E] floats.
    const std::vector<float> logits =
        cuda::to_host<float>(ws, static_cast<size_t>(tokens * experts));
    double worst = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < experts; ++e) {
        double want = 0, mag = 0;
        for (int64_t d = 0; d < hidden; ++d) {
          want += static_cast<double>(x[t * hidden + d]) * gate[e * hidden + d];
          mag += std::abs(static_cast<double>(x[t * hidden + d]) * gate[e * hidden + d]);
        }
        worst = std::max(worst, std::abs(logits[t * experts + e] - want) / mag);
      }
    }
    // fp32 accumulation over 512 products: well under 2^-9 relative to the sum of |terms|.
    EXPECT_LT(worst, 1e-5) << (b != nullptr ? "cuBLAS" : "GEMV");
  }
  EXPECT_EQ(got_ids[0], got_ids[1]);
}

TEST(GpuRouter, RefusesWhatTheCpuRefuses) {
  REQUIRE_GPU();
  const test::HostWeight gw = test::random_weight(6, 32, Format::kBF16, 1);
  const cuda::DeviceWeight dg = cuda::DeviceWeight::upload(gw.w);
  cuda::DeviceBuffer buf(4096);
  RouterParams p{.x = buf.as<float>(),
                 .gate = &dg.view(),
                 .num_tokens = 1,
                 .num_experts = 6,
                 .top_k = 2,
                 .n_group = 3,
                 .topk_group = 1,
                 .expert_ids = buf.as<int32_t>(),
                 .expert_weights = buf.as<float>()};
  EXPECT_THROW(cuda::route_experts(p, buf.data(), buf.size(), nullptr), InvalidArgument);
  p.n_group = 4;  // 6 experts do not split into 4 groups
  EXPECT_THROW(cuda::route_experts(p, buf.data(), buf.size(), nullptr), InvalidArgument);
  p.n_group = 1;
  EXPECT_THROW(cuda::route_experts(p, buf.data(), 0, nullptr), InvalidArgument);
}

// ---- experts ----

std::vector<float> run_cpu(const Experts& e, const std::vector<float>& x, const Routing& r,
                           int64_t tokens, int64_t top_k, bool shared,
                           const GatedActivation& act = {}) {
  const int64_t hidden = e.host_w[0].down.rows;
  // At least one element, so that the CPU op gets a non-null y for an empty batch.
  std::vector<float> y(std::max<int64_t>(tokens * hidden, 1));
  // The CPU op throws on id -1: give such slots expert 0 with weight 0 (adds +-0).
  Routing valid = r;
  for (size_t s = 0; s < valid.ids.size(); ++s) {
    if (valid.ids[s] < 0) {
      valid.ids[s] = 0;
      valid.weights[s] = 0.0f;
    }
  }
  cpu::moe({.x = x.data(),
            .num_tokens = tokens,
            .hidden = hidden,
            .experts = e.host_w.data(),
            .num_experts = static_cast<int64_t>(e.host_w.size()),
            .expert_ids = valid.ids.data(),
            .expert_weights = valid.weights.data(),
            .top_k = top_k,
            .shared = shared ? &e.shared.w : nullptr,
            .y = y.data(),
            .act = act});
  y.resize(tokens * hidden);
  return y;
}

std::vector<Shape> shapes_for(Format f) {
  std::vector<Shape> out = {{64, 96}, {320, 192}};
  if (!test::needs_cols_of_32(f)) out.push_back({65, 63});
  return out;
}

TEST(GpuMoe, FewTokensPerExpertMatchCpuEveryFormat) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (Format f : test::kAllFormats) {
    for (Shape s : shapes_for(f)) {
      const Experts e = make_experts(8, s.hidden, s.inter, f, seed);
      seed += 100;
      for (int64_t tokens : {1, 3, 5}) {
        for (int64_t top_k : {1, 3}) {
          for (bool shared : {false, true}) {
            SCOPED_TRACE(test::format_name(f) + " D=" + std::to_string(s.hidden) +
                         " I=" + std::to_string(s.inter) + " T=" + std::to_string(tokens) +
                         " top_k=" + std::to_string(top_k) + (shared ? " shared" : ""));
            const std::vector<float> x = test::random_floats(tokens * s.hidden, seed++);
            Routing r = random_routing(tokens, top_k, 8, seed++);
            if (tokens == 5 && top_k == 3) r.ids[4] = -1;  // skipped on the GPU
            const std::vector<float> want = run_cpu(e, x, r, tokens, top_k, shared);
            EXPECT_TRUE(test::all_close(run_gpu(e, x, r, tokens, top_k, shared, tokens == 3), want,
                                        2e-5f, 1e-4f));
          }
        }
      }
    }
  }
}

// Expert parallelism: ids are shifted by the rank's first expert and those outside its
// experts skipped, on the GPU as on the CPU (here: experts [2, 10) of the router's ids, so
// ids 0 and 1 belong to another rank).
TEST(GpuMoe, ExpertParallelSkipsOtherRanksExperts) {
  REQUIRE_GPU();
  const Experts e = make_experts(8, 64, 96, Format::kBF16, 77);
  for (int64_t tokens : {1, 5, 65}) {
    SCOPED_TRACE(tokens);
    const int64_t top_k = 3;
    const std::vector<float> x = test::random_floats(tokens * 64, 500 + tokens);
    const Routing r = random_routing(tokens, top_k, 8, 600 + tokens);
    std::vector<float> want(tokens * 64);
    cpu::moe({.x = x.data(),
              .num_tokens = tokens,
              .hidden = 64,
              .experts = e.host_w.data(),
              .num_experts = 8,
              .expert_ids = r.ids.data(),
              .expert_weights = r.weights.data(),
              .top_k = top_k,
              .y = want.data(),
              .act = {},
              .local_experts_only = true,
              .expert_offset = 2});
    Stream stream;
    cuda::Blas blas(stream.s);
    const cuda::DeviceBuffer dx = cuda::to_device(x);
    cuda::DeviceBuffer dy(x.size() * 4);
    const cuda::DeviceBuffer ids = cuda::to_device(r.ids);
    const cuda::DeviceBuffer weights = cuda::to_device(r.weights);
    cuda::DeviceBuffer ws(cuda::moe_workspace_bytes(e.table, nullptr, tokens, top_k));
    cuda::moe({.x = dx.as<float>(),
               .num_tokens = tokens,
               .hidden = 64,
               .num_experts = 8,
               .expert_ids = ids.as<int32_t>(),
               .expert_weights = weights.as<float>(),
               .top_k = top_k,
               .y = dy.as<float>(),
               .act = {},
               .local_experts_only = true,
               .expert_offset = 2},
              e.table, blas, ws.data(), ws.size(), stream.s, false);
    CUDA_CHECK(cudaStreamSynchronize(stream.s));
    const std::vector<float> got = cuda::to_host<float>(dy, static_cast<size_t>(tokens * 64));
    EXPECT_TRUE(test::all_close(got, want, 1e-2f * test::max_abs(want) + 1e-6f, 1e-2f));
  }
}

TEST(GpuMoe, ManyTokensPerExpertUseTensorCoresEveryFormat) {
  REQUIRE_GPU();
  uint64_t seed = 10000;
  for (Format f : test::kAllFormats) {
    for (Shape s : shapes_for(f)) {
      const Experts e = make_experts(8, s.hidden, s.inter, f, seed);
      seed += 100;
      for (int64_t tokens : {65, 321}) {
        for (int64_t top_k : {1, 3}) {
          const bool shared = tokens == 65;
          SCOPED_TRACE(test::format_name(f) + " D=" + std::to_string(s.hidden) +
                       " I=" + std::to_string(s.inter) + " T=" + std::to_string(tokens) +
                       " top_k=" + std::to_string(top_k) + (shared ? " shared" : ""));
          const std::vector<float> x = test::random_floats(tokens * s.hidden, seed++);
          const Routing r = mixed_routing(tokens, top_k, seed++);
          const std::vector<float> want = run_cpu(e, x, r, tokens, top_k, shared);
          const std::vector<float> got = run_gpu(e, x, r, tokens, top_k, shared, false);
          EXPECT_TRUE(test::all_close(got, want, 1e-2f * test::max_abs(want), 1e-2f));
          // Bucket order inside an expert is not fixed, the result is.
          const std::vector<float> again = run_gpu(e, x, r, tokens, top_k, shared, true);
          EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float)));
        }
      }
    }
  }
}

// Batch-invariant mode: every expert on the tensor-core tiles whatever its token count,
// so a token's output is the same bits alone as in a batch of 65 with mixed bucket sizes.
TEST(GpuMoe, BatchInvariantEachTokenAloneEqualsInBatch) {
  REQUIRE_GPU();
  uint64_t seed = 20000;
  for (Format f : {Format::kBF16, Format::kFp8F32Scales, Format::kMxfp4}) {
    const int64_t hidden = 64, inter = 96, tokens = 65, top_k = 3;
    const Experts e = make_experts(8, hidden, inter, f, seed);
    seed += 100;
    SCOPED_TRACE(test::format_name(f));
    const std::vector<float> x = test::random_floats(tokens * hidden, seed++);
    const Routing r = mixed_routing(tokens, top_k, seed++);
    const std::vector<float> want = run_cpu(e, x, r, tokens, top_k, true);
    const std::vector<float> all = run_gpu(e, x, r, tokens, top_k, true, false, true);
    EXPECT_TRUE(test::all_close(all, want, 1e-2f * test::max_abs(want), 1e-2f));
    for (int64_t t = 0; t < tokens; t += 4) {
      const std::vector<float> xt(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
      Routing rt;
      rt.ids.assign(r.ids.begin() + t * top_k, r.ids.begin() + (t + 1) * top_k);
      rt.weights.assign(r.weights.begin() + t * top_k, r.weights.begin() + (t + 1) * top_k);
      const std::vector<float> one = run_gpu(e, xt, rt, 1, top_k, true, false, true);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + t * hidden, hidden * sizeof(float)))
          << "token " << t;
    }
  }
}

// Kimi K3's SiTU (K3.md §3.7) in every expert and the shared MLP, on MXFP4 and bf16
// experts. Inputs span [-6, 6] so that the tanh caps bite (beta 4; linear_beta 2 as well
// as K3's 25, and 0: no cap on up). Calls where every expert has < 16 tokens, without
// batch invariance and with at most 16 tokens for the shared MLP, run fp32 GEMVs:
// abs 2e-5 * max(1, max|y|), rel 1e-4 (summation order, tanhf / expf ulps); any tensor-core
// tile (x and act(gate, up) rounded to bf16): abs 1e-2 * max|y|, rel 1e-2. In
// batch-invariant mode a token alone gives the same bits as in the batch.
TEST(GpuMoe, SituMatchesCpuMxfp4AndBf16) {
  REQUIRE_GPU();
  const GatedActivation acts[] = {
      {.kind = GatedActivation::Kind::kSitu, .beta = 4.0f, .linear_beta = 25.0f},
      {.kind = GatedActivation::Kind::kSitu, .beta = 4.0f, .linear_beta = 2.0f},
      {.kind = GatedActivation::Kind::kSitu, .beta = 1.5f, .linear_beta = 0.0f}};
  const int64_t hidden = 64, inter = 96, num_experts = 8, top_k = 3;
  uint64_t seed = 30000;
  for (Format f : {Format::kBF16, Format::kMxfp4}) {
    const Experts e = make_experts(num_experts, hidden, inter, f, seed);
    seed += 100;
    for (const GatedActivation& act : acts) {
      for (int64_t tokens : {0, 1, 3, 63, 65}) {
        for (bool shared : {false, true}) {
          for (bool batch_invariant : {false, true}) {
            SCOPED_TRACE(test::format_name(f) + " linear_beta " + std::to_string(act.linear_beta) +
                         " T=" + std::to_string(tokens) + (shared ? " shared" : "") +
                         (batch_invariant ? " batch-invariant" : ""));
            // At least one element / slot each, so that both ops get non-null pointers
            // for an empty batch.
            const std::vector<float> x =
                test::random_floats(std::max<int64_t>(tokens * hidden, 1), seed++, -6.0f, 6.0f);
            Routing r = random_routing(tokens, top_k, num_experts, seed++);
            if (tokens == 0) r = {{0}, {0.0f}};
            std::vector<int64_t> counts(num_experts, 0);
            for (int64_t s = 0; s < tokens * top_k; ++s) ++counts[r.ids[s]];
            const bool all_gemv =
                !batch_invariant &&
                *std::max_element(counts.begin(), counts.end()) < cuda::kMoeMmaMinTokens &&
                (!shared || tokens <= cuda::kSmallBatchMaxTokens);
            // The CPU op's shared MLP refuses T = 0 (null buffers): nothing to compare.
            const std::vector<float> want =
                tokens > 0 ? run_cpu(e, x, r, tokens, top_k, shared, act) : std::vector<float>{};
            const std::vector<float> got =
                run_gpu(e, x, r, tokens, top_k, shared, tokens == 3, batch_invariant, act);
            const float scale = test::max_abs(want);
            if (all_gemv) {
              EXPECT_TRUE(test::all_close(got, want, 2e-5f * std::max(1.0f, scale), 1e-4f));
            } else {
              EXPECT_TRUE(test::all_close(got, want, 1e-2f * scale, 1e-2f));
            }
            if (!batch_invariant || tokens != 65) continue;
            for (int64_t t = 0; t < tokens; t += 16) {
              const std::vector<float> xt(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
              Routing rt;
              rt.ids.assign(r.ids.begin() + t * top_k, r.ids.begin() + (t + 1) * top_k);
              rt.weights.assign(r.weights.begin() + t * top_k, r.weights.begin() + (t + 1) * top_k);
              const std::vector<float> one = run_gpu(e, xt, rt, 1, top_k, shared, false, true, act);
              ASSERT_EQ(0, std::memcmp(one.data(), got.data() + t * hidden, hidden * sizeof(float)))
                  << "token " << t;
            }
          }
        }
      }
    }
  }
}

// The decode kernels (BF16, FP8 with either scale type, MXFP4 experts with <= 16 tokens)
// at awkward token counts, all slots on one expert (every other expert empty) or spread:
// with fp32 activations (three bf16 terms) they must hold the fp32 GEMV's tolerance (abs
// 2e-5 * max(1, max|y|), rel 1e-4), with bf16 activations the tiles' (1e-2). Shapes with a
// partial last k iteration (320 = 2.5 MXFP4 iterations; its scale rows of 10 bytes take
// the byte-wise scale copy), a partial last stage of two iterations (384 = 3 MXFP4
// iterations, aligned scale words), a k long enough for the 1- and 2-token experts' k
// split (1024: 4 MXFP4 stages, 16 BF16), row counts that are not whole 16-row tiles (bf16
// 72 -> 40), and more tokens than the decode kernels take (17, 63, 65: the tiles) in the
// same sweep.
TEST(GpuMoe, DecodeKernelsAwkwardCountsMatchCpu) {
  REQUIRE_GPU();
  uint64_t seed = 40000;
  for (Format f : {Format::kBF16, Format::kFp8F32Scales, Format::kFp8Bf16Scales, Format::kMxfp4}) {
    std::vector<Shape> shapes = {{320, 192}, {384, 256}, {1024, 1024}};
    if (f == Format::kBF16) shapes.push_back({72, 40});
    for (Shape s : shapes) {
      const Experts e = make_experts(8, s.hidden, s.inter, f, seed);
      seed += 100;
      ASSERT_TRUE(e.table.decode_kernels()) << test::format_name(f);
      if (f == Format::kMxfp4) {
        EXPECT_EQ(s.hidden % 128 == 0, e.table.scale_words(0));
        EXPECT_EQ(s.inter % 128 == 0, e.table.scale_words(1));
      }
      for (int64_t n : {1, 3, 8, 9, 15, 16, 17, 63, 65}) {
        for (bool spread : {false, true}) {
          const int64_t tokens = n;
          const int64_t top_k = spread ? 3 : 1;
          SCOPED_TRACE(test::format_name(f) + " D=" + std::to_string(s.hidden) +
                       " I=" + std::to_string(s.inter) + " n=" + std::to_string(n) +
                       (spread ? " spread" : " one expert"));
          const std::vector<float> x = test::random_floats(tokens * s.hidden, seed++, -2.0f, 2.0f);
          Routing r = random_routing(tokens, top_k, 8, seed++);
          if (!spread) r.ids.assign(r.ids.size(), 5);
          std::vector<int64_t> counts(8, 0);
          for (int32_t id : r.ids) ++counts[id];
          // The shared MLP (spread) runs cuBLAS's bf16 GEMMs past 16 tokens.
          const bool decode_only =
              *std::max_element(counts.begin(), counts.end()) <= cuda::kMoeDecodeMaxTokens &&
              (!spread || tokens <= cuda::kSmallBatchMaxTokens);
          const std::vector<float> want = run_cpu(e, x, r, tokens, top_k, spread);
          const float scale = test::max_abs(want);
          const std::vector<float> got = run_gpu(e, x, r, tokens, top_k, spread, false);
          if (decode_only) {
            EXPECT_TRUE(test::all_close(got, want, 2e-5f * std::max(1.0f, scale), 1e-4f));
          } else {
            EXPECT_TRUE(test::all_close(got, want, 1e-2f * scale, 1e-2f));
          }
          const std::vector<float> bf16 = run_gpu(e, x, r, tokens, top_k, spread, false, false, {},
                                                  cuda::MoeDecodeInput::kBf16);
          EXPECT_TRUE(test::all_close(bf16, want, 1e-2f * scale, 1e-2f));
          // Bucket order and the k slices' timing do not change the bits.
          const std::vector<float> again = run_gpu(e, x, r, tokens, top_k, spread, true);
          EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float)));
        }
      }
    }
  }
}

// MXFP4 scales past 2^1 (e8m0 > 128: the decode's second multiply) and below 2^-20, per row,
// so every output row depends on its own scales: the decode kernels against the CPU.
TEST(GpuMoe, DecodeKernelsMxfp4WideScales) {
  REQUIRE_GPU();
  const int64_t hidden = 256, inter = 128, num_experts = 4, top_k = 2;
  Experts e;
  for (int64_t i = 0; i < num_experts; ++i) {
    test::HostMlp m = test::random_mlp(hidden, inter, Format::kMxfp4, 900 + 3 * i);
    for (test::HostWeight* w : {&m.gate, &m.up, &m.down}) {
      const int64_t groups = w->w.cols / 32;
      for (int64_t r = 0; r < w->w.rows; ++r) {
        // Rows alternate between scales well above 2^1 and well below 2^-20.
        const int shift = r % 2 == 0 ? 10 + static_cast<int>(r % 7) : -20 - static_cast<int>(r % 5);
        for (int64_t gi = 0; gi < groups; ++gi) {
          uint8_t& sc = w->scales[r * groups + gi];
          sc = static_cast<uint8_t>(std::clamp(static_cast<int>(sc) + shift, 1, 254));
        }
      }
    }
    e.host.push_back(std::move(m));
  }
  for (auto& m : e.host) {
    m.w = MlpWeights{m.gate.w, m.up.w, m.down.w};
    e.host_w.push_back(m.w);
    e.dev.push_back(test::upload(m));
  }
  for (const auto& d : e.dev) e.dev_w.push_back(d.w);
  e.table = cuda::MoeExperts::upload(e.dev_w.data(), num_experts);
  for (int64_t tokens : {1, 5}) {
    SCOPED_TRACE(tokens);
    const std::vector<float> x = test::random_floats(tokens * hidden, 950 + tokens, -1e-3f, 1e-3f);
    const Routing r = random_routing(tokens, top_k, num_experts, 960 + tokens);
    const std::vector<float> want = run_cpu(e, x, r, tokens, top_k, false);
    const std::vector<float> got = run_gpu(e, x, r, tokens, top_k, false, false);
    for (float v : want) ASSERT_TRUE(std::isfinite(v));
    EXPECT_TRUE(test::all_close(got, want, 2e-5f * std::max(1.0f, test::max_abs(want)), 1e-4f));
  }
}

// The prefill kernels (moe_prefill.cuh: BF16, FP8 with either scale type, MXFP4 experts
// with > 16 tokens, hidden and inter multiples of 64) on warpgroup MMAs, and for BF16 also
// CUTLASS's grouped GEMM (grouped_gemm.h), against the CPU at
// the tensor-core tiles' tolerance (x and act(gate, up) rounded to bf16: abs 1e-2 * max|y|,
// rel 1e-2). Per-expert counts around the 128-position tile (17, 63, 64, 65, 128, 129, 300)
// with a decode-sized (5) and an empty expert in the same call, every token on one expert
// (all others empty), and a random spread of top-8 over 64 experts; shapes with partial
// n-tiles (hidden 320: 256 + 64 columns; inter 192: 128 + 64 columns of h), an odd count of
// 64-wide k steps (320, 192: FP8's last 128-wide scale block half full) and several tiles
// each way (1024 x 768); SiLU and K3's SiTU. A token's output does not depend on where its
// rows land in the tiles: the batch with its tokens reversed gives the same bits.
TEST(GpuMoe, PrefillKernelsMatchCpuAtAwkwardCounts) {
  REQUIRE_GPU();
  const GatedActivation situ{
      .kind = GatedActivation::Kind::kSitu, .beta = 4.0f, .linear_beta = 25.0f};
  uint64_t seed = 50000;
  for (Format f : {Format::kBF16, Format::kFp8F32Scales, Format::kFp8Bf16Scales, Format::kMxfp4}) {
    for (Shape s : std::vector<Shape>{{320, 192}, {1024, 768}}) {
      const int64_t num_experts = 64;
      Experts e = make_experts(num_experts, s.hidden, s.inter, f, seed);
      seed += 1000;
      ASSERT_TRUE(e.table.prefill_kernels()) << test::format_name(f);
      EXPECT_EQ(e.table.grouped_gemm(), f == Format::kBF16) << test::format_name(f);
      // {name, tokens, top_k, routing}
      struct Case {
        std::string name;
        int64_t tokens, top_k;
        Routing r;
      };
      std::vector<Case> cases;
      {
        // Experts 0..7 with these counts (top-1, tokens shuffled), the rest empty.
        const int64_t counts[] = {17, 63, 0, 65, 128, 129, 5, 300};
        std::vector<int32_t> ids;
        for (int32_t x = 0; x < 8; ++x) ids.insert(ids.end(), counts[x], x);
        std::mt19937_64 rng(seed++);
        std::shuffle(ids.begin(), ids.end(), rng);
        Routing r;
        r.ids = ids;
        std::uniform_real_distribution<float> w(0.1f, 1.5f);
        for (size_t i = 0; i < ids.size(); ++i) r.weights.push_back(w(rng));
        cases.push_back({"counts", static_cast<int64_t>(ids.size()), 1, r});
      }
      {
        Routing r = random_routing(700, 1, num_experts, seed++);
        r.ids.assign(r.ids.size(), 41);
        cases.push_back({"one expert", 700, 1, r});
      }
      cases.push_back({"spread", 512, 8, random_routing(512, 8, num_experts, seed++)});
      std::vector<cuda::MoePrefillKernel> kernels = {cuda::MoePrefillKernel::kWarpgroup};
      if (f == Format::kBF16) kernels.push_back(cuda::MoePrefillKernel::kGrouped);
      for (cuda::MoePrefillKernel kernel : kernels) {
        e.table.set_prefill_kernel(kernel);
        for (const Case& c : cases) {
          for (bool use_situ : {false, true}) {
            const GatedActivation act = use_situ ? situ : GatedActivation{};
            SCOPED_TRACE(test::format_name(f) + " D=" + std::to_string(s.hidden) + " I=" +
                         std::to_string(s.inter) + " " + c.name + (use_situ ? " situ" : "") +
                         (kernel == cuda::MoePrefillKernel::kGrouped ? " grouped" : ""));
            const std::vector<float> x =
                test::random_floats(c.tokens * s.hidden, seed++, -2.0f, 2.0f);
            const bool shared = c.name == "spread";
            const std::vector<float> want = run_cpu(e, x, c.r, c.tokens, c.top_k, shared, act);
            const std::vector<float> got =
                run_gpu(e, x, c.r, c.tokens, c.top_k, shared, false, false, act);
            EXPECT_TRUE(test::all_close(got, want, 1e-2f * test::max_abs(want), 1e-2f));
            // Reversed tokens: each token's rows in other tiles, at other rows.
            std::vector<float> xr(x.size());
            Routing rr;
            for (int64_t t = 0; t < c.tokens; ++t) {
              const int64_t from = c.tokens - 1 - t;
              std::copy_n(x.begin() + from * s.hidden, s.hidden, xr.begin() + t * s.hidden);
              rr.ids.insert(rr.ids.end(), c.r.ids.begin() + from * c.top_k,
                            c.r.ids.begin() + (from + 1) * c.top_k);
              rr.weights.insert(rr.weights.end(), c.r.weights.begin() + from * c.top_k,
                                c.r.weights.begin() + (from + 1) * c.top_k);
            }
            const std::vector<float> rev =
                run_gpu(e, xr, rr, c.tokens, c.top_k, shared, true, false, act);
            for (int64_t t = 0; t < c.tokens; ++t) {
              ASSERT_EQ(0, std::memcmp(rev.data() + t * s.hidden,
                                       got.data() + (c.tokens - 1 - t) * s.hidden,
                                       s.hidden * sizeof(float)))
                  << "token " << t;
            }
          }
        }
      }
    }
  }
  // Shapes and formats the prefill kernels do not take (the tiles of mma_tile.cuh run).
  EXPECT_FALSE(make_experts(2, 64, 96, Format::kBF16, 1).table.prefill_kernels());
  EXPECT_FALSE(make_experts(2, 96, 64, Format::kBF16, 1).table.prefill_kernels());
  EXPECT_FALSE(make_experts(2, 64, 64, Format::kF16, 1).table.prefill_kernels());
  EXPECT_FALSE(make_experts(2, 64, 64, Format::kInt4, 1).table.prefill_kernels());
}

// CUTLASS's grouped GEMM (grouped_gemm.h) on BF16 experts whose hidden and inter are
// multiples of 8 but not of 64 (partial k and n tiles; the warpgroup prefill kernels refuse
// them), at the tensor-core tiles' tolerance: per-expert counts 0, 1, 3 (the decode
// kernels, same call), 63, 65, 4,097, and every token on one expert; a refused kernel
// choice; shapes it does not take.
TEST(GpuMoe, GroupedGemmMatchesCpuAtAwkwardShapes) {
  REQUIRE_GPU();
  uint64_t seed = 61000;
  for (Shape s : std::vector<Shape>{{200, 136}, {72, 328}}) {
    Experts e = make_experts(16, s.hidden, s.inter, Format::kBF16, seed);
    seed += 100;
    ASSERT_TRUE(e.table.grouped_gemm());
    EXPECT_FALSE(e.table.prefill_kernels());
    EXPECT_THROW(e.table.set_prefill_kernel(cuda::MoePrefillKernel::kWarpgroup), InvalidArgument);
    e.table.set_prefill_kernel(cuda::MoePrefillKernel::kGrouped);
    std::vector<std::pair<std::string, std::vector<int32_t>>> cases;
    {
      const int64_t counts[] = {0, 1, 3, 63, 65, 4097};
      std::vector<int32_t> ids;
      for (int32_t x = 0; x < 6; ++x) ids.insert(ids.end(), counts[x], x + 5);
      std::mt19937_64 rng(seed++);
      std::shuffle(ids.begin(), ids.end(), rng);
      cases.push_back({"counts", ids});
    }
    cases.push_back({"one expert", std::vector<int32_t>(300, 15)});
    for (const auto& [name, ids] : cases) {
      SCOPED_TRACE("D=" + std::to_string(s.hidden) + " I=" + std::to_string(s.inter) + " " + name);
      const auto tokens = static_cast<int64_t>(ids.size());
      Routing r;
      r.ids = ids;
      std::mt19937_64 rng(seed++);
      std::uniform_real_distribution<float> w(0.1f, 1.5f);
      for (size_t i = 0; i < ids.size(); ++i) r.weights.push_back(w(rng));
      const std::vector<float> x = test::random_floats(tokens * s.hidden, seed++, -2.0f, 2.0f);
      const std::vector<float> want = run_cpu(e, x, r, tokens, 1, false);
      const std::vector<float> got = run_gpu(e, x, r, tokens, 1, false, false);
      EXPECT_TRUE(test::all_close(got, want, 1e-2f * test::max_abs(want), 1e-2f));
    }
  }
  EXPECT_FALSE(make_experts(2, 68, 64, Format::kBF16, 1).table.grouped_gemm());
  EXPECT_FALSE(make_experts(2, 64, 64, Format::kFp8F32Scales, 1).table.grouped_gemm());
}

TEST(GpuMoe, EmptyBatchAndBadArguments) {
  REQUIRE_GPU();
  const Experts e = make_experts(4, 64, 32, Format::kBF16, 1);
  Stream stream;
  cuda::Blas blas(stream.s);
  cuda::DeviceBuffer buf(1 << 16);
  MoeParams p{.x = buf.as<float>(),
              .num_tokens = 0,
              .hidden = 64,
              .num_experts = 4,
              .expert_ids = buf.as<int32_t>(),
              .expert_weights = buf.as<float>(),
              .top_k = 2,
              .y = buf.as<float>(),
              .act = {}};
  EXPECT_NO_THROW(cuda::moe(p, e.table, blas, nullptr, 0, stream.s));
  p.num_tokens = 4;
  EXPECT_THROW(cuda::moe(p, e.table, blas, buf.data(), 16, stream.s), InvalidArgument);
  p.act = {.kind = GatedActivation::Kind::kSitu, .beta = 0.0f, .linear_beta = 0.0f};  // beta > 0
  EXPECT_THROW(cuda::moe(p, e.table, blas, buf.data(), buf.size(), stream.s), InvalidArgument);
  p.act = {};
  p.num_experts = 5;
  EXPECT_THROW(cuda::moe(p, e.table, blas, buf.data(), buf.size(), stream.s), InvalidArgument);
  // Experts of different shapes cannot share one table.
  std::vector<MlpWeights> mixed = e.dev_w;
  const test::HostMlp other = test::random_mlp(64, 64, Format::kBF16, 9);
  const test::DeviceMlp other_dev = test::upload(other);
  mixed[2] = other_dev.w;
  EXPECT_THROW(cuda::MoeExperts::upload(mixed.data(), 4), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
