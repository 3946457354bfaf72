// hyserve_cpu_linear_bench: the CPU linear layer, the reference's fixed-order dot products
// beside OpenBLAS's sgemm (CpuGemm, kernels/linear/params.h), at a model's projection shapes
// and token counts (issue 49). One JSON line per shape, weight format and token count: the
// best of --reps calls of each path in GFLOP/s (2 x tokens x rows x cols per call), and
// each as a ratio to the peak measured in the same run (sgemm on dense fp32, 4096 x 4096 x
// 512, all threads).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "kernels/linear/params.h"
#include "util/parallel.h"

namespace hyserve {
namespace {

struct Matrix {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  Weight w;
};

Matrix random_weight(int64_t rows, int64_t cols, bool bf16, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.02f);
  Matrix m;
  m.w.rows = rows;
  m.w.cols = cols;
  if (bf16) {
    m.bf16.resize(static_cast<size_t>(rows * cols));
    for (auto& v : m.bf16) v = f32_to_bf16(dist(rng));
    m.w.dtype = DType::kBF16;
    m.w.data = m.bf16.data();
  } else {
    m.f32.resize(static_cast<size_t>(rows * cols));
    for (auto& v : m.f32) v = dist(rng);
    m.w.dtype = DType::kF32;
    m.w.data = m.f32.data();
  }
  return m;
}

// Best GFLOP/s of `reps` calls.
double gflops(const Weight& w, const std::vector<float>& x, int64_t tokens, cpu::CpuGemm gemm,
              int reps) {
  std::vector<float> y(static_cast<size_t>(tokens * w.rows));
  double best_s = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::linear({.x = x.data(), .w = &w, .y = y.data(), .num_tokens = tokens}, gemm);
    best_s = std::min(best_s,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(tokens) * static_cast<double>(w.rows * w.cols) / best_s * 1e-9;
}

int run(int argc, char** argv) {
  CLI::App app{"The CPU linear: the reference beside OpenBLAS"};
  int reps = 3;
  std::vector<int64_t> tokens = {1, 8, 64, 512};
  app.add_option("--reps", reps, "calls per measurement (the best counts)")->capture_default_str();
  app.add_option("--tokens", tokens, "token counts")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  std::mt19937 rng(1);
  const auto input = [&](int64_t n, int64_t cols) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n * cols));
    for (auto& v : x) v = dist(rng);
    return x;
  };
  const Matrix peak_w = random_weight(4096, 4096, false, rng);
  const double peak =
      cpu::blas_linked() ? gflops(peak_w.w, input(512, 4096), 512, cpu::CpuGemm::kBlas, reps) : 0;
  // (rows, cols): the bundled model's q projection, a 2K-wide model's MLP, Kimi Linear's
  // hidden 2304 into an expert's 1024.
  const std::pair<int64_t, int64_t> shapes[] = {{64, 64}, {5632, 2048}, {1024, 2304}};
  for (const auto& [rows, cols] : shapes) {
    for (const bool bf16 : {false, true}) {
      const Matrix m = random_weight(rows, cols, bf16, rng);
      for (const int64_t n : tokens) {
        const std::vector<float> x = input(n, cols);
        const double ref = gflops(m.w, x, n, cpu::CpuGemm::kReference, reps);
        const double blas = gflops(m.w, x, n, cpu::CpuGemm::kBlas, reps);
        nlohmann::json j;
        j["bench"] = "cpu_linear";
        j["threads"] = num_cpu_threads();
        j["rows"] = rows;
        j["cols"] = cols;
        j["weight"] = bf16 ? "bf16" : "f32";
        j["tokens"] = n;
        j["reference_gflops"] = ref;
        j["blas_gflops"] = blas;
        j["blas_over_reference"] = blas / ref;
        j["peak_sgemm_gflops"] = peak;
        j["reference_of_peak"] = peak > 0 ? ref / peak : 0.0;
        j["blas_of_peak"] = peak > 0 ? blas / peak : 0.0;
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace hyserve

int main(int argc, char** argv) {
  return hyserve::run(argc, argv);
}
