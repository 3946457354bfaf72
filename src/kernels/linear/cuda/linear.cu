// CUDA linear: the GEMV path (gemv.cuh) for small batches, cuBLAS bf16 GEMMs for large
// ones, the batch-invariant tensor-core tiles (mma_tile.cuh), and the embedding gather.
// See cuda.h for the numerics of each path.
#include <cuda_bf16.h>

#include <algorithm>
#include <span>

#include "kernels/linear/cuda.h"
#include "kernels/linear/cuda/gemv.cuh"
#include "kernels/linear/cuda/mma_tile.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kGemvWarps = 8;  // rows per block, one warp each
constexpr int kThreads = 256;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Block (row block, token group): warp w computes rows (blockIdx.x * kGemvWarps + w) *
// kGemvRows .. + kGemvRows for tokens [16 * blockIdx.y, +16).
template <WFmt F, bool kVec>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(WRef w, const float* __restrict__ x, const float* __restrict__ bias,
                float* __restrict__ y, int64_t num_tokens) {
  __shared__ const float* xs[kGemvMaxTokens];
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kGemvMaxTokens;
  const int n =
      static_cast<int>(num_tokens - t0 < kGemvMaxTokens ? num_tokens - t0 : kGemvMaxTokens);
  if (threadIdx.x < n) xs[threadIdx.x] = x + (t0 + threadIdx.x) * w.cols;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32) * kGemvRows;
  if (r0 >= w.rows) return;
  const int num_rows = static_cast<int>(w.rows - r0 < kGemvRows ? w.rows - r0 : kGemvRows);
  float acc[kGemvRows][kGemvMaxTokens] = {};
  lane_row_dots<F, kVec>(w, r0, num_rows, xs, n, lane, acc);
  warp_sum(acc, num_rows, n);
#pragma unroll
  for (int q = 0; q < kGemvRows; ++q) {
    const float b = bias != nullptr && q < num_rows ? bias[r0 + q] : 0.0f;
#pragma unroll
    for (int j = 0; j < kGemvMaxTokens; ++j) {
      if (q < num_rows && j < n && lane == j) y[(t0 + j) * w.rows + r0 + q] = acc[q][j] + b;
    }
  }
}

// The two block shapes of the batch-invariant path (mma_tile.cuh): how many tokens and
// threads a block has, its shared memory, and how it computes its [tokens, kBN] tile.
struct SmallTiles {
  static constexpr int kTokens = tile::SmallTile::kTokens;
  static constexpr int kThreads = tile::kMmaThreads;
  using Smem = tile::MmaSmem<tile::SmallTile, 1>;
  template <WFmt F, bool kVec>
  __device__ static const float* compute(const WRef& w, int64_t n0, Smem& s) {
    const WRef ws[1] = {w};
    tile::mma_tile<tile::SmallTile, F, kVec, 1>(ws, n0, s);
    return s.c[0];
  }
};
struct LargeTiles {
  static constexpr int kTokens = tile::LargeTile::kTokens;
  static constexpr int kThreads = tile::kLargeThreads;
  using Smem = tile::LargeSmem;
  template <WFmt F, bool kVec>
  __device__ static const float* compute(const WRef& w, int64_t n0, Smem& s) {
    tile::mma_tile_large<F, kVec>(w, n0, s);
    return s.c;
  }
};

// Block (row block, token block): y[m0 .. m0 + tokens, n0 .. n0 + kBN] (+ bias) by the
// block shape B.
template <class B, WFmt F, bool kVec>
__global__ void __launch_bounds__(B::kThreads)
    tiles_kernel(WRef w, const float* __restrict__ x, const float* __restrict__ bias,
                 float* __restrict__ y, int64_t num_tokens) {
  __shared__ typename B::Smem s;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * tile::kBN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * B::kTokens;
  if (threadIdx.x < B::kTokens) {
    const int64_t m = m0 + threadIdx.x;
    s.rows[threadIdx.x] = m < num_tokens ? x + m * w.cols : nullptr;
  }
  __syncthreads();
  const float* c = B::template compute<F, kVec>(w, n0, s);
  for (int i = threadIdx.x; i < B::kTokens * tile::kBN; i += B::kThreads) {
    const int64_t m = m0 + i / tile::kBN;
    const int64_t n = n0 + i % tile::kBN;
    if (m < num_tokens && n < w.rows) {
      const float v = c[(i / tile::kBN) * tile::kLdC + i % tile::kBN];
      y[m * w.rows + n] = bias != nullptr ? v + bias[n] : v;
    }
  }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ out,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(x[i]);
  }
}

// out[i, k] = bf16(W[r0 + i, k]) for i < num_rows; kVec: one 16-byte chunk per step.
template <WFmt F, bool kVec>
__global__ void dequant_rows_kernel(WRef w, int64_t r0, int64_t num_rows,
                                    __nv_bfloat16* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if constexpr (kVec) {
    constexpr int kE = kChunkElems<F>;
    const int64_t chunks_per_row = w.cols / kE;
    const uint4* base = reinterpret_cast<const uint4*>(w.data) + r0 * chunks_per_row;
    for (int64_t i = first; i < num_rows * chunks_per_row; i += stride) {
      const int64_t r = r0 + i / chunks_per_row;
      const int64_t k = (i % chunks_per_row) * kE;
      float v[kE];
      decode_chunk_scaled<F>(__ldg(base + i), element_scale<F>(w, r, k), v);
#pragma unroll
      for (int e = 0; e < kE; e += 2) {
        reinterpret_cast<__nv_bfloat162*>(out + i * kE)[e / 2] =
            __floats2bfloat162_rn(v[e], v[e + 1]);
      }
    }
  } else {
    for (int64_t i = first; i < num_rows * w.cols; i += stride) {
      out[i] = __float2bfloat16(element<F>(w, r0 + i / w.cols, i % w.cols));
    }
  }
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t rows,
                                int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % rows];
  }
}

// One block per token: its row of the table, -0.0f for a vocabulary row another rank
// holds, NaN for an id outside the vocabulary.
template <WFmt F>
__global__ void embedding_kernel(WRef w, const int32_t* __restrict__ ids, int64_t first_id,
                                 int64_t vocab_size, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t id = ids[i];
  const int64_t row = id - first_id;
  float* o = out + i * w.cols;
  const bool valid = id >= 0 && id < vocab_size;
  const bool here = row >= 0 && row < w.rows;
  for (int64_t k = threadIdx.x; k < w.cols; k += blockDim.x) {
    o[k] = !valid ? __uint_as_float(0x7fc00000u) : here ? element<F>(w, row, k) : -0.0f;
  }
}

int grid_for(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65536));
}

template <WFmt F>
void launch_gemv(const WRef& w, const LinearParams& p, bool vec, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = kGemvWarps * kGemvRows;
  const dim3 grid(static_cast<unsigned>((w.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((p.num_tokens + kGemvMaxTokens - 1) / kGemvMaxTokens));
  if (vec) {
    gemv_kernel<F, true><<<grid, kGemvWarps * 32, 0, stream>>>(w, p.x, p.bias, p.y, p.num_tokens);
  } else {
    gemv_kernel<F, false><<<grid, kGemvWarps * 32, 0, stream>>>(w, p.x, p.bias, p.y, p.num_tokens);
  }
  CUDA_CHECK_LAUNCH();
}

template <WFmt F>
void launch_dequant_rows(const WRef& w, int64_t r0, int64_t num_rows, __nv_bfloat16* out,
                         cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // MXFP4 measured faster element by element (32 outputs per chunk crowd the registers);
  // INT4 has the same 32 outputs per chunk and takes the same path (not measured).
  if constexpr (F != WFmt::kMxfp4 && F != WFmt::kInt4) {
    if (aligned(w.data) && aligned(out) && row_bytes(F, w.cols) % 16 == 0) {
      dequant_rows_kernel<F, true>
          <<<grid_for(num_rows * w.cols / kChunkElems<F>), kThreads, 0, stream>>>(w, r0, num_rows,
                                                                                  out);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  dequant_rows_kernel<F, false>
      <<<grid_for(num_rows * w.cols), kThreads, 0, stream>>>(w, r0, num_rows, out);
  CUDA_CHECK_LAUNCH();
}

bool overlaps(const float* a, int64_t a_len, const float* b, int64_t b_len) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_len * sizeof(float) && b0 < a0 + a_len * sizeof(float);
}

// y[T, m] (leading dimension ldy) = xb[T, k] wb[m, k]^T, bf16 inputs, fp32 accumulate.
void gemm_bf16(const Blas& blas, const __nv_bfloat16* wb, const __nv_bfloat16* xb, float* y,
               int64_t m, int64_t num_tokens, int64_t k, int64_t ldy) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m),
                            static_cast<int>(num_tokens), static_cast<int>(k), &alpha, wb,
                            CUDA_R_16BF, static_cast<int>(k), xb, CUDA_R_16BF, static_cast<int>(k),
                            &beta, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

// Checks p; returns false when there is nothing to do.
bool check_linear(const LinearParams& p) {
  CHECK(p.x != nullptr && p.w != nullptr && p.y != nullptr, "linear: null pointer");
  CHECK(p.num_tokens >= 0, "linear: num_tokens ", p.num_tokens);
  const WRef w = make_wref(*p.w);
  CHECK(!overlaps(p.x, p.num_tokens * w.cols, p.y, p.num_tokens * w.rows), "linear: y overlaps x");
  CHECK(w.rows <= INT32_MAX && w.cols <= INT32_MAX && p.num_tokens <= INT32_MAX,
        "linear: dimensions over 2^31");
  return p.num_tokens > 0;
}

template <class B>
void launch_tiles(const LinearParams& p, cudaStream_t stream) {
  const WRef w = make_wref(*p.w);
  const WFmt f = weight_wfmt(*p.w);
  const int64_t token_blocks = (p.num_tokens + B::kTokens - 1) / B::kTokens;
  CHECK(token_blocks <= 65535, "linear: ", p.num_tokens,
        " tokens are too many for the batch-invariant path");
  const dim3 grid(static_cast<unsigned>((w.rows + tile::kBN - 1) / tile::kBN),
                  static_cast<unsigned>(token_blocks));
  const bool vec = gemv_vectorizable(w, f, p.x);
  dispatch_format(f, [&]<WFmt F>() {
    if (vec) {
      tiles_kernel<B, F, true><<<grid, B::kThreads, 0, stream>>>(w, p.x, p.bias, p.y, p.num_tokens);
    } else {
      tiles_kernel<B, F, false>
          <<<grid, B::kThreads, 0, stream>>>(w, p.x, p.bias, p.y, p.num_tokens);
    }
    CUDA_CHECK_LAUNCH();
  });
}

// The small tile up to 16 tokens (memory-bound: deeper k steps), the large one above; the
// same bits either way (mma_tile.cuh).
void run_tiles(const LinearParams& p, cudaStream_t stream) {
  if (p.num_tokens <= tile::SmallTile::kTokens) {
    launch_tiles<SmallTiles>(p, stream);
  } else {
    launch_tiles<LargeTiles>(p, stream);
  }
}

void run_gemv(const LinearParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens <= int64_t{65535} * kGemvMaxTokens, "linear: ", p.num_tokens,
        " tokens are too many for the GEMV path");
  const WRef w = make_wref(*p.w);
  const WFmt f = weight_wfmt(*p.w);
  const bool vec = gemv_vectorizable(w, f, p.x);
  dispatch_format(f, [&]<WFmt F>() { launch_gemv<F>(w, p, vec, stream); });
}

}  // namespace

size_t linear_workspace_bytes(const Weight& w, int64_t max_tokens) {
  CHECK(max_tokens >= 0, "linear_workspace_bytes: max_tokens ", max_tokens);
  const WFmt f = weight_wfmt(w);
  size_t bytes = align_up(static_cast<size_t>(max_tokens * w.cols) * 2);
  if (f != WFmt::kBF16) {
    bytes += align_up(static_cast<size_t>(std::min(w.rows, kGemmRowBlock) * w.cols) * 2);
  }
  return bytes;
}

void linear_gemv(const LinearParams& p, cudaStream_t stream) {
  if (check_linear(p)) run_gemv(p, stream);
}

namespace {

// The tensor-core path of one linear whose input is already in bf16 (xb); wb: room for a
// kGemmRowBlock-row block of decoded weights unless w is dense BF16.
void gemm_from_bf16(const LinearParams& p, const Blas& blas, const __nv_bfloat16* xb,
                    __nv_bfloat16* wb, cudaStream_t stream) {
  const WRef w = make_wref(*p.w);
  const WFmt f = weight_wfmt(*p.w);
  if (f == WFmt::kBF16) {
    gemm_bf16(blas, reinterpret_cast<const __nv_bfloat16*>(w.data), xb, p.y, w.rows, p.num_tokens,
              w.cols, w.rows);
  } else {
    for (int64_t r0 = 0; r0 < w.rows; r0 += kGemmRowBlock) {
      const int64_t m = std::min(kGemmRowBlock, w.rows - r0);
      dispatch_format(f, [&]<WFmt F>() { launch_dequant_rows<F>(w, r0, m, wb, stream); });
      gemm_bf16(blas, wb, xb, p.y + r0, m, p.num_tokens, w.cols, w.rows);
    }
  }
  if (p.bias != nullptr) {
    const int64_t ny = p.num_tokens * w.rows;
    add_bias_kernel<<<grid_for(ny), kThreads, 0, stream>>>(p.y, p.bias, w.rows, ny);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

size_t linears_workspace_bytes(std::span<const LinearParams> ps) {
  if (ps.empty()) return 0;
  size_t blocks = 0;
  for (const LinearParams& p : ps) {
    if (weight_wfmt(*p.w) == WFmt::kBF16) continue;
    blocks = std::max(
        blocks, align_up(static_cast<size_t>(std::min(p.w->rows, kGemmRowBlock) * p.w->cols) * 2));
  }
  return align_up(static_cast<size_t>(ps[0].num_tokens * ps[0].w->cols) * 2) + blocks;
}

void linears(std::span<const LinearParams> ps, const Blas& blas, void* workspace,
             size_t workspace_bytes, cudaStream_t stream, LinearKernel kernel) {
  CHECK(blas.stream() == stream, "linear: the Blas handle is bound to another stream");
  if (ps.empty()) return;
  for (const LinearParams& p : ps) {
    CHECK(p.w != nullptr && ps[0].w != nullptr, "linear: null pointer");
    CHECK(p.x == ps[0].x && p.num_tokens == ps[0].num_tokens && p.w->cols == ps[0].w->cols,
          "linears: the projections do not share one input");
    check_linear(p);
  }
  const LinearParams& first = ps[0];
  if (first.num_tokens == 0) return;
  const bool tensor_cores =
      kernel == LinearKernel::kCublas ||
      (kernel == LinearKernel::kAuto && first.num_tokens > kSmallBatchMaxTokens);
  if (!tensor_cores) {
    for (const LinearParams& p : ps) {
      if (kernel == LinearKernel::kBatchInvariant) {
        run_tiles(p, stream);
      } else {
        run_gemv(p, stream);
      }
    }
    return;
  }
  const size_t need = linears_workspace_bytes(ps);
  CHECK(workspace != nullptr && workspace_bytes >= need, "linear: workspace of ", workspace_bytes,
        " bytes, the tensor-core path for ", first.num_tokens, " tokens needs ", need);
  // x rounded to bf16 once for every projection.
  auto* xb = static_cast<__nv_bfloat16*>(workspace);
  const int64_t nx = first.num_tokens * first.w->cols;
  f32_to_bf16_kernel<<<grid_for(nx), kThreads, 0, stream>>>(first.x, xb, nx);
  CUDA_CHECK_LAUNCH();
  auto* wb = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(workspace) +
                                              align_up(static_cast<size_t>(nx) * 2));
  for (const LinearParams& p : ps) gemm_from_bf16(p, blas, xb, wb, stream);
}

void linear(const LinearParams& p, const Blas& blas, void* workspace, size_t workspace_bytes,
            cudaStream_t stream, LinearKernel kernel) {
  linears(std::span<const LinearParams>(&p, 1), blas, workspace, workspace_bytes, stream, kernel);
}

void embedding_lookup(const EmbeddingParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens >= 0, "embedding_lookup: n ", p.num_tokens);
  if (p.num_tokens == 0) return;
  CHECK(p.table != nullptr && p.ids != nullptr && p.out != nullptr,
        "embedding_lookup: null pointer");
  CHECK(p.num_tokens <= INT32_MAX, "embedding_lookup: n ", p.num_tokens, " over 2^31");
  CHECK(p.first_id >= 0 && p.first_id + p.table->rows <= p.vocab_size, "embedding_lookup: rows [",
        p.first_id, ", ", p.first_id + p.table->rows, ") of a vocabulary of ", p.vocab_size);
  const WRef w = make_wref(*p.table);
  dispatch_format(weight_wfmt(*p.table), [&]<WFmt F>() {
    embedding_kernel<F><<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(
        w, p.ids, p.first_id, p.vocab_size, p.out);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hyserve::cuda
