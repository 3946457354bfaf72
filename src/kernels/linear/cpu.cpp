// CPU linear layers. The reference: parallel over blocks of output rows; a block's weight
// rows are decoded once into a per-range buffer and dotted with every token, so quantized
// weights cost one decode per call, not one per token. CpuGemm::kBlas hands calls of many
// tokens to OpenBLAS instead (cpu_blas.cpp).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/linear/cpu_blas.h"
#include "kernels/linear/params.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {
namespace {

constexpr int64_t kRowBlock = 8;
constexpr int kLanes = 8;

// fp32 dot product with kLanes interleaved partial sums, combined pairwise. The
// order depends only on n.
float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i + j < n; ++j) acc[j] += a[i + j] * b[i + j];
  for (int half = kLanes / 2; half > 0; half /= 2) {
    for (int j = 0; j < half; ++j) acc[j] += acc[j + half];
  }
  return acc[0];
}

bool overlaps(const float* a, int64_t a_len, const float* b, int64_t b_len) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_len * sizeof(float) && b0 < a0 + a_len * sizeof(float);
}

}  // namespace

void linear(const LinearParams& p, CpuGemm gemm) {
  CHECK(p.w != nullptr, "linear: null weight");
  CHECK(p.num_tokens == 0 || (p.x != nullptr && p.y != nullptr), "linear: null pointer");
  CHECK(!p.w->empty() && p.w->rows > 0 && p.w->cols > 0, "linear: weight shape [", p.w->rows, ", ",
        p.w->cols, "]");
  CHECK(p.num_tokens >= 0, "linear: num_tokens ", p.num_tokens);
  const int64_t rows = p.w->rows;
  const int64_t cols = p.w->cols;
  const int64_t num_tokens = p.num_tokens;
  CHECK(!overlaps(p.x, num_tokens * cols, p.y, num_tokens * rows), "linear: y overlaps x");
  if (num_tokens == 0) return;
  if (gemm == CpuGemm::kBlas && num_tokens >= kBlasMinTokens && blas_linked()) {
    linear_blas(p);
    return;
  }
  const int64_t num_blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_for(num_blocks, [&](int64_t block_begin, int64_t block_end) {
    std::vector<float> w_rows(kRowBlock * cols);  // [kRowBlock, cols]
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t r0 = b * kRowBlock;
      const int64_t n = std::min(kRowBlock, rows - r0);
      for (int64_t i = 0; i < n; ++i) p.w->dequantize_row(r0 + i, w_rows.data() + i * cols);
      for (int64_t t = 0; t < num_tokens; ++t) {
        const float* x = p.x + t * cols;
        float* y = p.y + t * rows + r0;
        for (int64_t i = 0; i < n; ++i) {
          y[i] = dot(x, w_rows.data() + i * cols, cols);
          if (p.bias != nullptr) y[i] += p.bias[r0 + i];
        }
      }
    }
  });
}

CpuGemm parse_cpu_gemm(std::string_view name) {
  if (name == "blas") return CpuGemm::kBlas;
  if (name == "reference") return CpuGemm::kReference;
  HYSERVE_THROW(InvalidArgument, "--cpu-gemm must be blas or reference, got '", name, "'");
}

void embedding_lookup(const EmbeddingParams& p) {
  CHECK(p.num_tokens >= 0, "embedding_lookup: n ", p.num_tokens);
  if (p.num_tokens == 0) return;
  CHECK(p.table != nullptr && p.ids != nullptr && p.out != nullptr,
        "embedding_lookup: null pointer");
  const Weight& table = *p.table;
  CHECK(!table.empty() && table.rows > 0 && table.cols > 0, "embedding_lookup: table shape [",
        table.rows, ", ", table.cols, "]");
  CHECK(p.first_id >= 0 && p.first_id + table.rows <= p.vocab_size, "embedding_lookup: rows [",
        p.first_id, ", ", p.first_id + table.rows, ") of a vocabulary of ", p.vocab_size);
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    CHECK(p.ids[i] >= 0 && p.ids[i] < p.vocab_size, "embedding_lookup: token id ", p.ids[i],
          " at position ", i, " is outside the vocabulary [0, ", p.vocab_size, ")");
  }
  const int64_t dim = table.cols;
  parallel_for(
      p.num_tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t row = p.ids[i] - p.first_id;
          float* out = p.out + i * dim;
          if (row >= 0 && row < table.rows) {
            table.dequantize_row(row, out);
          } else {
            std::fill(out, out + dim, -0.0f);
          }
        }
      },
      16);
}

void linears(const LinearsParams& p, CpuGemm gemm) {
  for (const LinearParams& l : p.linears) linear(l, gemm);
}

}  // namespace hyserve::cpu
