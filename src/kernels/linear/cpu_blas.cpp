// OpenBLAS under the CPU linear (cpu_blas.h). Each parallel_for worker calls a
// single-threaded sgemm on its own block of weight rows (and tokens): OpenBLAS's pthread
// build is safe to call from several threads at once, and one pool of threads (ours) owns
// the cores, so no two pools spin against each other on a small machine.
#include "kernels/linear/cpu_blas.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "util/error.h"
#include "util/parallel.h"

#ifdef HYSERVE_WITH_BLAS
#include <cblas.h>

#include <cstdlib>
#include <mutex>
#endif

namespace hyserve::cpu {

#ifdef HYSERVE_WITH_BLAS

namespace {

// Weight rows per sgemm call: the decoded block ([kBlockRows, cols] fp32) stays in L2 for
// common widths while the call is long enough to amortize packing x.
constexpr int64_t kBlockRows = 128;
// Fewest tokens per call when the tokens are split over threads.
constexpr int64_t kMinTokensPerCall = 16;
// OpenBLAS's pthread build (MAX_THREADS 64 in Debian's) keeps a bounded table of work buffers,
// one per call in flight: at most this many calls at once, however many cores the pool has.
constexpr int64_t kMaxConcurrentCalls = 64;

void use_one_openblas_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Runs before OpenBLAS's own constructor (default priority), which reads the environment.
// OpenBLAS 0.3.21 (Debian 12) picks its kernels by CPU model number and falls back to its
// slowest, SSE3 "Prescott", on models it does not know (Xeons of family 6 model 207: 22
// GFLOP/s of sgemm on one core where its AVX-512 kernels give 148): choose by the instruction
// set instead, unless the user set OPENBLAS_CORETYPE. And no OpenBLAS thread pool: every call
// is single-threaded (parallel_for owns the cores; linear_blas sets one OpenBLAS thread on first
// use whatever OPENBLAS_NUM_THREADS says, which only decides whether OpenBLAS starts a pool).
__attribute__((constructor(200))) void configure_openblas() {
  __builtin_cpu_init();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      setenv("OPENBLAS_CORETYPE", "Haswell", 0);
    }
  }
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
}

}  // namespace

bool blas_linked() {
  return true;
}

void linear_blas(const LinearParams& p) {
  use_one_openblas_thread();
  const Weight& w = *p.w;
  const int64_t rows = w.rows, cols = w.cols, num_tokens = p.num_tokens;
  const bool dense_f32 = w.format == WeightFormat::kDense && w.dtype == DType::kF32;
  const int64_t num_row_blocks = (rows + kBlockRows - 1) / kBlockRows;
  // Token ranges when the row blocks alone leave threads idle.
  const int64_t threads = num_cpu_threads();
  const int64_t num_token_ranges =
      std::clamp<int64_t>((threads + num_row_blocks - 1) / num_row_blocks, 1,
                          std::max<int64_t>(1, num_tokens / kMinTokensPerCall));
  const int64_t tokens_per_range = (num_tokens + num_token_ranges - 1) / num_token_ranges;
  // At most kMaxConcurrentCalls sgemm calls at once, each slot taking every num_slots-th task.
  const int64_t num_tasks = num_row_blocks * num_token_ranges;
  const int64_t num_slots = std::min(num_tasks, kMaxConcurrentCalls);
  parallel_for(num_slots, [&](int64_t slot_begin, int64_t slot_end) {
    std::vector<float> decoded;  // [kBlockRows, cols]
    int64_t decoded_block = -1;
    for (int64_t slot = slot_begin; slot < slot_end; ++slot) {
      for (int64_t task = slot; task < num_tasks; task += num_slots) {
        const int64_t block = task / num_token_ranges, range = task % num_token_ranges;
        const int64_t r0 = block * kBlockRows, n = std::min(kBlockRows, rows - r0);
        const int64_t t0 = range * tokens_per_range;
        const int64_t m = std::min(tokens_per_range, num_tokens - t0);
        if (m <= 0) continue;
        const float* w_rows = nullptr;
        if (dense_f32) {
          w_rows = static_cast<const float*>(w.data) + r0 * cols;
        } else {
          if (decoded_block != block) {
            decoded.resize(static_cast<size_t>(n * cols));
            for (int64_t i = 0; i < n; ++i) w.dequantize_row(r0 + i, decoded.data() + i * cols);
            decoded_block = block;
          }
          w_rows = decoded.data();
        }
        float* y = p.y + t0 * rows + r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                    static_cast<int>(n), static_cast<int>(cols), 1.0f, p.x + t0 * cols,
                    static_cast<int>(cols), w_rows, static_cast<int>(cols), 0.0f, y,
                    static_cast<int>(rows));
        if (p.bias == nullptr) continue;
        for (int64_t t = 0; t < m; ++t) {
          for (int64_t i = 0; i < n; ++i) y[t * rows + i] += p.bias[r0 + i];
        }
      }
    }
  });
}

#else

bool blas_linked() {
  return false;
}

void linear_blas(const LinearParams& p) {
  HYSERVE_THROW(InvalidArgument, "linear_blas: this hyserve was built without OpenBLAS (",
                p.w->rows, "x", p.w->cols, " weight)");
}

#endif

}  // namespace hyserve::cpu
