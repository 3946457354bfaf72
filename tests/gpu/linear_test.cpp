// CUDA linear / linear_gemv / embedding_lookup against the CPU ops, every weight format,
// both paths, awkward and empty sizes. Tolerances, per output (t, r) with
// S = sum_k |x_k w_k| and K = cols:
//   GEMV path: fp32 as on the CPU, only the summation order differs:
//              |got - want| <= 2 K 2^-24 S.
//   tensor-core path: x is rounded to bf16 (and F32 / F16 / FP8 / INT4 weights too; BF16
//              and MXFP4 are exact in bf16), fp32 accumulation. Against a double reference
//              on the rounded operands: <= 2 K 2^-24 S; against the CPU op: <= 2^-7 S
//              (two roundings of at most 2^-9 relative each, with margin).
//   batch-invariant tiles: as the tensor-core path, except that FP8 weights keep their
//              exact e4m3 values (the block scale multiplies fp32 partial sums), so the
//              double reference uses the exact decoded FP8 weights. And bitwise: a
//              token's row is the same at any T and at any place in the batch.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/device_weight.h"
#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/linear/cuda.h"
#include "kernels/linear/params.h"
#include "model/tensor_parallel.h"

namespace hyserve {
namespace {

using test::Format;

using test::Stream;

struct Shape {
  int64_t rows, cols;
};

// Shapes for every format (cols % 32 == 0, so MXFP4 / INT4 fit) and dense / FP8-only ones.
const Shape kShapes[] = {{1, 32}, {3, 64}, {63, 96}, {65, 160}, {321, 128}, {130, 256}};
const Shape kAwkwardShapes[] = {{1, 1}, {3, 3}, {63, 63}, {65, 65}, {5, 321}, {129, 200}};

std::vector<Shape> shapes_for(Format f) {
  std::vector<Shape> out(std::begin(kShapes), std::end(kShapes));
  if (!test::needs_cols_of_32(f))
    out.insert(out.end(), std::begin(kAwkwardShapes), std::end(kAwkwardShapes));
  return out;
}

// sum_k |x_k w_k| per output [T, rows], and the double dot products.
struct Reference {
  std::vector<float> y;
  std::vector<double> magnitude;
};

Reference reference(const std::vector<float>& x, const std::vector<float>& w, int64_t t,
                    int64_t rows, int64_t cols, const std::vector<float>* bias) {
  Reference ref{std::vector<float>(t * rows), std::vector<double>(t * rows)};
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0, mag = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double term = static_cast<double>(x[i * cols + k]) * w[r * cols + k];
        sum += term;
        mag += std::fabs(term);
      }
      if (bias != nullptr) sum += (*bias)[r];
      ref.y[i * rows + r] = static_cast<float>(sum);
      ref.magnitude[i * rows + r] = mag;
    }
  }
  return ref;
}

// |got - want| <= factor * magnitude + 1e-30 everywhere; names the worst element.
testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& want,
                                const std::vector<double>& magnitude, double factor) {
  if (got.size() != want.size()) return testing::AssertionFailure() << "size mismatch";
  double worst = 0.0;
  size_t at = 0;
  bool bad = false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double allowed = factor * magnitude[i] + 1e-30;
    if (!(err <= allowed)) {
      const double ratio = std::isnan(err) ? INFINITY : err / allowed;
      if (!bad || ratio > worst) {
        worst = ratio;
        at = i;
      }
      bad = true;
    }
  }
  if (!bad) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "worst element " << at << ": got " << got[at] << ", want "
                                     << want[at] << ", allowed " << factor * magnitude[at];
}

std::vector<float> round_all_bf16(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Runs cuda::linear on device copies; returns y.
std::vector<float> run_gpu(const Weight& host_w, const std::vector<float>& x, int64_t t,
                           const std::vector<float>* bias, cuda::LinearKernel kernel) {
  Stream stream;
  cuda::Blas blas(stream.s);
  const cuda::DeviceWeight dw = cuda::DeviceWeight::upload(host_w);
  const cuda::DeviceBuffer dx = cuda::to_device(x);
  cuda::DeviceBuffer dy(static_cast<size_t>(t * host_w.rows) * sizeof(float) + 4);
  cuda::DeviceBuffer db = bias != nullptr ? cuda::to_device(*bias) : cuda::DeviceBuffer();
  cuda::DeviceBuffer ws(cuda::linear_workspace_bytes(host_w, t));
  cuda::linear({.x = dx.as<float>(),
                .w = &dw.view(),
                .y = dy.as<float>(),
                .num_tokens = t,
                .bias = bias != nullptr ? db.as<float>() : nullptr},
               blas, ws.data(), ws.size(), stream.s, kernel);
  CUDA_CHECK(cudaStreamSynchronize(stream.s));
  return cuda::to_host<float>(dy, static_cast<size_t>(t * host_w.rows));
}

std::vector<float> run_cpu(const Weight& w, const std::vector<float>& x, int64_t t,
                           const std::vector<float>* bias) {
  std::vector<float> y(t * w.rows);
  cpu::linear({.x = x.data(),
               .w = &w,
               .y = y.data(),
               .num_tokens = t,
               .bias = bias != nullptr ? bias->data() : nullptr});
  return y;
}

TEST(GpuLinear, GemvMatchesCpuEveryFormat) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (Format f : test::kAllFormats) {
    for (const Shape& s : shapes_for(f)) {
      const test::HostWeight w = test::random_weight(s.rows, s.cols, f, seed++);
      const std::vector<float> decoded = test::decode(w.w);
      for (int64_t t : {1, 3, 16, 17, 63, 65}) {
        SCOPED_TRACE(test::format_name(f) + " [" + std::to_string(s.rows) + ", " +
                     std::to_string(s.cols) + "] T=" + std::to_string(t));
        const std::vector<float> x = test::random_floats(t * s.cols, seed++);
        const std::vector<float> bias = test::random_floats(s.rows, seed++);
        const std::vector<float>* b = t % 2 == 1 ? &bias : nullptr;
        // Above 16 tokens the GEMV path runs in several token groups.
        const std::vector<float> got = run_gpu(w.w, x, t, b, cuda::LinearKernel::kGemv);
        const Reference ref = reference(x, decoded, t, s.rows, s.cols, b);
        const double factor = 2.0 * s.cols * 0x1p-24;
        EXPECT_TRUE(within(got, run_cpu(w.w, x, t, b), ref.magnitude, factor));
      }
    }
  }
}

TEST(GpuLinear, TensorCoreMatchesBf16ReferenceEveryFormat) {
  REQUIRE_GPU();
  uint64_t seed = 1000;
  for (Format f : test::kAllFormats) {
    for (const Shape& s : shapes_for(f)) {
      const test::HostWeight w = test::random_weight(s.rows, s.cols, f, seed++);
      const std::vector<float> decoded = test::decode(w.w);
      const std::vector<float> decoded_bf16 = round_all_bf16(decoded);
      for (int64_t t : {1, 17, 65, 321}) {
        SCOPED_TRACE(test::format_name(f) + " [" + std::to_string(s.rows) + ", " +
                     std::to_string(s.cols) + "] T=" + std::to_string(t));
        const std::vector<float> x = test::random_floats(t * s.cols, seed++);
        const std::vector<float> bias = test::random_floats(s.rows, seed++);
        const std::vector<float>* b = t % 2 == 1 ? &bias : nullptr;
        const std::vector<float> got = run_gpu(w.w, x, t, b, cuda::LinearKernel::kCublas);
        const Reference rounded = reference(round_all_bf16(x), decoded_bf16, t, s.rows, s.cols, b);
        EXPECT_TRUE(within(got, rounded.y, rounded.magnitude, 2.0 * s.cols * 0x1p-24));
        const Reference exact = reference(x, decoded, t, s.rows, s.cols, b);
        EXPECT_TRUE(within(got, run_cpu(w.w, x, t, b), exact.magnitude, 0x1p-7));
      }
    }
  }
}

TEST(GpuLinear, LargeMatrixEveryFormatBothPaths) {
  REQUIRE_GPU();
  const int64_t rows = 300, cols = 2048;
  uint64_t seed = 2000;
  for (Format f : test::kAllFormats) {
    SCOPED_TRACE(test::format_name(f));
    const test::HostWeight w = test::random_weight(rows, cols, f, seed++);
    const std::vector<float> decoded = test::decode(w.w);
    for (int64_t t : {1, 5, 40}) {
      const std::vector<float> x = test::random_floats(t * cols, seed++);
      const Reference ref = reference(x, decoded, t, rows, cols, nullptr);
      const std::vector<float> want = run_cpu(w.w, x, t, nullptr);
      EXPECT_TRUE(within(run_gpu(w.w, x, t, nullptr, cuda::LinearKernel::kGemv), want,
                         ref.magnitude, 2.0 * cols * 0x1p-24));
      EXPECT_TRUE(within(run_gpu(w.w, x, t, nullptr, cuda::LinearKernel::kCublas), want,
                         ref.magnitude, 0x1p-7));
    }
  }
}

TEST(GpuLinear, GemvIsBatchInvariant) {
  REQUIRE_GPU();
  for (Format f : {Format::kBF16, Format::kFp8F32Scales, Format::kMxfp4, Format::kF16}) {
    SCOPED_TRACE(test::format_name(f));
    const int64_t rows = 65, cols = 256, t = 37;
    const test::HostWeight w = test::random_weight(rows, cols, f, 7);
    const std::vector<float> x = test::random_floats(t * cols, 8);
    const std::vector<float> all = run_gpu(w.w, x, t, nullptr, cuda::LinearKernel::kGemv);
    for (int64_t i = 0; i < t; ++i) {
      const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
      const std::vector<float> one = run_gpu(w.w, xi, 1, nullptr, cuda::LinearKernel::kGemv);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + i * rows, rows * sizeof(float)))
          << "token " << i;
    }
  }
}

TEST(GpuLinear, BatchInvariantTilesMatchReferenceEveryFormat) {
  REQUIRE_GPU();
  uint64_t seed = 4000;
  for (Format f : test::kAllFormats) {
    for (const Shape& s : shapes_for(f)) {
      const test::HostWeight w = test::random_weight(s.rows, s.cols, f, seed++);
      const std::vector<float> decoded = test::decode(w.w);
      const bool fp8 = f == Format::kFp8F32Scales || f == Format::kFp8Bf16Scales;
      const std::vector<float> w_ref = fp8 ? decoded : round_all_bf16(decoded);
      for (int64_t t : {1, 17, 65, 130}) {
        SCOPED_TRACE(test::format_name(f) + " [" + std::to_string(s.rows) + ", " +
                     std::to_string(s.cols) + "] T=" + std::to_string(t));
        const std::vector<float> x = test::random_floats(t * s.cols, seed++);
        const std::vector<float> bias = test::random_floats(s.rows, seed++);
        const std::vector<float>* b = t % 2 == 1 ? &bias : nullptr;
        const std::vector<float> got = run_gpu(w.w, x, t, b, cuda::LinearKernel::kBatchInvariant);
        const Reference rounded = reference(round_all_bf16(x), w_ref, t, s.rows, s.cols, b);
        // Plus one rounding of the output: the bias add, and for FP8 the block scale
        // applied to the partial sum (the reference's weights are raw * scale rounded).
        std::vector<double> magnitude = rounded.magnitude;
        for (size_t i = 0; i < magnitude.size(); ++i) magnitude[i] += std::fabs(rounded.y[i]);
        EXPECT_TRUE(within(got, rounded.y, magnitude, 2.0 * s.cols * 0x1p-24));
        const Reference exact = reference(x, decoded, t, s.rows, s.cols, b);
        EXPECT_TRUE(within(got, run_cpu(w.w, x, t, b), exact.magnitude, 0x1p-7));
      }
    }
  }
}

// Every token of a 150-token batch computed again alone, in small batches, and at other
// places in a batch (reversed order): the same bits each time.
TEST(GpuLinear, BatchInvariantTilesAreBitwiseIndependentOfTheBatch) {
  REQUIRE_GPU();
  for (Format f : test::kAllFormats) {
    for (const Shape& s : {Shape{130, 256}, Shape{65, 65}}) {
      if (test::needs_cols_of_32(f) && s.cols % 32 != 0) continue;
      SCOPED_TRACE(test::format_name(f) + " [" + std::to_string(s.rows) + ", " +
                   std::to_string(s.cols) + "]");
      const int64_t t = 150;
      const test::HostWeight w = test::random_weight(s.rows, s.cols, f, 11);
      const std::vector<float> x = test::random_floats(t * s.cols, 12);
      const std::vector<float> bias = test::random_floats(s.rows, 13);
      const auto k = cuda::LinearKernel::kBatchInvariant;
      const std::vector<float> all = run_gpu(w.w, x, t, &bias, k);
      const auto row_of = [&](const std::vector<float>& y, int64_t i) {
        return y.data() + i * s.rows;
      };
      const size_t row_bytes = static_cast<size_t>(s.rows) * sizeof(float);
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{65}}) {
        for (int64_t i0 = 0; i0 + n <= t; i0 += 37) {
          const std::vector<float> xs(x.begin() + i0 * s.cols, x.begin() + (i0 + n) * s.cols);
          const std::vector<float> part = run_gpu(w.w, xs, n, &bias, k);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(0, std::memcmp(row_of(part, i), row_of(all, i0 + i), row_bytes))
                << "token " << i0 + i << " in a batch of " << n;
          }
        }
      }
      std::vector<float> reversed;
      for (int64_t i = t - 1; i >= 0; --i) {
        reversed.insert(reversed.end(), x.begin() + i * s.cols, x.begin() + (i + 1) * s.cols);
      }
      const std::vector<float> back = run_gpu(w.w, reversed, t, &bias, k);
      for (int64_t i = 0; i < t; ++i) {
        ASSERT_EQ(0, std::memcmp(row_of(back, t - 1 - i), row_of(all, i), row_bytes))
            << "token " << i << " reversed";
      }
    }
  }
}

TEST(GpuLinear, EmptyBatchLeavesOutputAlone) {
  REQUIRE_GPU();
  Stream stream;
  cuda::Blas blas(stream.s);
  const test::HostWeight w = test::random_weight(8, 32, Format::kBF16, 3);
  const cuda::DeviceWeight dw = cuda::DeviceWeight::upload(w.w);
  const std::vector<float> sentinel(8, 42.0f);
  cuda::DeviceBuffer dy = cuda::to_device(sentinel);
  const cuda::DeviceBuffer dx = cuda::to_device(std::vector<float>(32, 1.0f));
  for (cuda::LinearKernel k : {cuda::LinearKernel::kAuto, cuda::LinearKernel::kCublas,
                               cuda::LinearKernel::kBatchInvariant}) {
    cuda::linear({.x = dx.as<float>(), .w = &dw.view(), .y = dy.as<float>(), .num_tokens = 0}, blas,
                 nullptr, 0, stream.s, k);
  }
  cuda::linear_gemv({.x = dx.as<float>(), .w = &dw.view(), .y = dy.as<float>(), .num_tokens = 0},
                    stream.s);
  CUDA_CHECK(cudaStreamSynchronize(stream.s));
  EXPECT_EQ(cuda::to_host<float>(dy, 8), sentinel);
}

TEST(GpuLinear, RefusesBadArguments) {
  REQUIRE_GPU();
  Stream stream;
  Stream other;
  cuda::Blas blas(stream.s);
  const test::HostWeight w = test::random_weight(8, 32, Format::kFp8F32Scales, 3);
  const cuda::DeviceWeight dw = cuda::DeviceWeight::upload(w.w);
  cuda::DeviceBuffer dx(64 * 32 * sizeof(float));
  cuda::DeviceBuffer dy(64 * 8 * sizeof(float));
  const LinearParams p{.x = dx.as<float>(), .w = &dw.view(), .y = dy.as<float>(), .num_tokens = 64};
  cuda::DeviceBuffer small_ws(cuda::linear_workspace_bytes(w.w, 64) - 1);
  EXPECT_THROW(cuda::linear(p, blas, small_ws.data(), small_ws.size(), stream.s), InvalidArgument);
  cuda::DeviceBuffer ws(cuda::linear_workspace_bytes(w.w, 64));
  EXPECT_THROW(cuda::linear(p, blas, ws.data(), ws.size(), other.s), InvalidArgument);
  LinearParams overlap = p;
  overlap.y = dx.as<float>();
  EXPECT_THROW(cuda::linear_gemv(overlap, stream.s), InvalidArgument);
}

TEST(GpuEmbedding, MatchesCpuBitwiseAndMarksBadIdsNaN) {
  REQUIRE_GPU();
  Stream stream;
  uint64_t seed = 3000;
  for (Format f : test::kAllFormats) {
    for (const Shape& s : shapes_for(f)) {
      SCOPED_TRACE(test::format_name(f) + " [" + std::to_string(s.rows) + ", " +
                   std::to_string(s.cols) + "]");
      const test::HostWeight w = test::random_weight(s.rows, s.cols, f, seed++);
      const cuda::DeviceWeight dw = cuda::DeviceWeight::upload(w.w);
      std::vector<int32_t> ids = {0, static_cast<int32_t>(s.rows - 1)};
      std::mt19937 rng(static_cast<uint32_t>(seed));
      for (int i = 0; i < 61; ++i) ids.push_back(static_cast<int32_t>(rng() % s.rows));
      const auto n = static_cast<int64_t>(ids.size());
      std::vector<float> want(n * s.cols);
      cpu::embedding_lookup(EmbeddingParams{&w.w, ids.data(), want.data(), n, 0, s.rows});
      ids.push_back(static_cast<int32_t>(s.rows));  // out of range: a NaN row
      ids.push_back(-1);
      const cuda::DeviceBuffer dids = cuda::to_device(ids);
      cuda::DeviceBuffer out(ids.size() * s.cols * sizeof(float));
      const EmbeddingParams p{&dw.view(), dids.as<int32_t>(), out.as<float>(), n + 2, 0, s.rows};
      cuda::embedding_lookup(p, stream.s);
      CUDA_CHECK(cudaStreamSynchronize(stream.s));
      const std::vector<float> got = cuda::to_host<float>(out, ids.size() * s.cols);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
      for (int64_t k = n * s.cols; k < static_cast<int64_t>(got.size()); ++k) {
        ASSERT_TRUE(std::isnan(got[k])) << "element " << k;
      }
      cuda::embedding_lookup({&dw.view(), dids.as<int32_t>(), out.as<float>(), 0, 0, s.rows},
                             stream.s);
      // Rank 1 of 2's share of the rows: the same as the CPU's, -0.0f rows for rank 0's ids.
      const VocabShard v = vocab_shard(s.rows, 1, 2);
      if (v.rows > 0 && (w.w.format != WeightFormat::kFp8Block || v.stride % 128 == 0)) {
        const Weight half = vocab_rows(w.w, v, "embed");
        const cuda::DeviceWeight dhalf = cuda::DeviceWeight::upload(half);
        std::vector<float> want_half(n * s.cols);
        cpu::embedding_lookup({&half, ids.data(), want_half.data(), n, v.first, s.rows});
        cuda::embedding_lookup(
            {&dhalf.view(), dids.as<int32_t>(), out.as<float>(), n, v.first, s.rows}, stream.s);
        CUDA_CHECK(cudaStreamSynchronize(stream.s));
        const std::vector<float> got_half = cuda::to_host<float>(out, n * s.cols);
        EXPECT_EQ(0, std::memcmp(got_half.data(), want_half.data(), want_half.size() * 4));
      }
    }
  }
}

}  // namespace
}  // namespace hyserve
