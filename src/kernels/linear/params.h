// Linear layers and the embedding table: everything that reads a Weight matrix
// (dense, FP8 block or MXFP4) row by row. y = x W^T (+ bias) is the workhorse of
// every projection in MODEL.md; embedding_lookup is a gather of decoded rows.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/weight.h"

namespace hyserve {

// y = x W^T (+ bias). Each output is one fp32 dot product over w->cols in a fixed
// order, so a token's result is bitwise the same whatever batch it is in.
// y must not overlap x.
struct LinearParams {
  const float* x = nullptr;   // [num_tokens, w->cols]
  const Weight* w = nullptr;  // [rows, cols]
  float* y = nullptr;         // [num_tokens, w->rows]
  int64_t num_tokens = 0;
  const float* bias = nullptr;  // [w->rows], or null
};

// Several linears of one input (the same x, num_tokens and input width): each result as
// LinearParams gives it; a backend may share work on x (the CUDA tensor-core path rounds
// it to bf16 once).
struct LinearsParams {
  std::span<const LinearParams> linears;
};

// out[i] = table[ids[i] - first_id] decoded to fp32, for a table holding the vocabulary
// rows [first_id, first_id + table->rows) of vocab_size (a tensor-parallel rank's share,
// model/tensor_parallel.h; the whole table: first_id 0, vocab_size table->rows). An id of
// the vocabulary outside the table's rows gives a row of -0.0f: the zero whose sum with any
// float x is exactly x (+0.0f + -0.0f = +0.0f), so that summing the ranks' rows is exact.
struct EmbeddingParams {
  const Weight* table = nullptr;  // [rows, dim]
  const int32_t* ids = nullptr;   // [num_tokens], each in [0, vocab_size)
  float* out = nullptr;           // [num_tokens, dim]
  int64_t num_tokens = 0;
  int64_t first_id = 0;
  int64_t vocab_size = 0;  // >= first_id + table->rows
};

namespace cpu {

// How the CPU ops multiply by a weight matrix (linear, linears, mlp, moe):
//   kReference  each output one fp32 dot product in a fixed order (LinearParams): a token's
//               bits never depend on the other tokens of the call (batch-invariant mode);
//   kBlas       calls of at least kBlasMinTokens tokens through OpenBLAS's sgemm when it is
//               linked (blas_linked()), the reference otherwise: its summation order is the
//               library's and may depend on the number of tokens; within the fp32
//               summation bound of exact math, as the reference (tests/cpu_blas_test.cpp).
enum class CpuGemm : uint8_t { kReference, kBlas };
inline constexpr int64_t kBlasMinTokens = 4;
// Whether this binary links OpenBLAS (CMake's HYSERVE_BLAS).
bool blas_linked();
// "blas" or "reference" (the --cpu-gemm flag); throws naming the accepted values.
CpuGemm parse_cpu_gemm(std::string_view name);

void linear(const LinearParams& p, CpuGemm gemm = CpuGemm::kReference);
// Each of p.linears as linear() computes it.
void linears(const LinearsParams& p, CpuGemm gemm = CpuGemm::kReference);
// Throws naming the id when one is outside [0, vocab_size).
void embedding_lookup(const EmbeddingParams& p);

}  // namespace cpu
}  // namespace hyserve
