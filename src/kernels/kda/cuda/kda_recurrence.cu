// CUDA KDA delta-rule recurrence (cuda.h), token by token and chunked. Both grids are
// heads x V-slices of kSlice columns: column e of S only needs k, q, g, beta and v[e],
// so a block owns S[:, slice] in shared memory for the whole call.
//
// Chunked, per chunk of n <= 64 tokens (MODEL.md §4.6, the CPU chunk_step):
//   G = inclusive cumsum of g (double) -> L, Aqk (exp(G_c - G_j) <= 1 only)
//   -> (I+L)^-1 by forward substitution, row by row -> A -> W, U -> V' = U - W S
//   -> O = (Q exp(G)) S + Aqk V' -> S = exp(G_last) S + (exp(G_last - G) K)^T V'.
//
// Shared memory of the chunked block (C = chunk size, K = head_dim):
//   G [C, K] double | L/A [C, C] | inv [C, C] | Aqk [C, C] | W [C, K] | U/V' [C, kSlice]
//   | S [K, kSlice]          (K = 128, C = 64: 168 KiB)
#include <cuda_runtime.h>

#include "kernels/kda/check.h"
#include "kernels/kda/cuda.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kSlice = 32;  // V columns per block
constexpr int kMaxHeadDim = 128;
constexpr int kMaxChunk = 64;
constexpr int kChunkThreads = 256;

struct HeadIndex {
  int64_t num_heads, dim, h;
  __device__ int64_t row(int64_t t) const { return (t * num_heads + h) * dim; }
};

// One warp: lane = column of the slice. q, k, exp(g) of the token are staged in shared.
__global__ void recurrent_kernel(KdaParams p) {
  extern __shared__ float smem[];
  const int64_t dk = p.head_dim;
  const int64_t dv = p.head_dim;
  const HeadIndex hi{p.num_heads, p.head_dim, blockIdx.x};
  const int lane = threadIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kSlice + lane;
  float* s_col = smem;               // [K, kSlice]
  float* q_s = s_col + dk * kSlice;  // [K]
  float* k_s = q_s + dk;             // [K]
  float* decay_s = k_s + dk;         // [K]
  float* state = kda_head_state(p, blockIdx.x);
  const bool active = e < dv;
  if (active) {
    for (int64_t d = 0; d < dk; ++d) s_col[d * kSlice + lane] = state[d * dv + e];
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t row = hi.row(t);
    for (int64_t d = lane; d < dk; d += kSlice) {
      q_s[d] = p.q[row + d];
      k_s[d] = p.k[row + d];
      decay_s[d] = expf(p.g[row + d]);
    }
    __syncwarp();
    if (active) {
      float kv = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float s = s_col[d * kSlice + lane] * decay_s[d];
        s_col[d * kSlice + lane] = s;
        kv += k_s[d] * s;
      }
      kv = p.beta[t * p.num_heads + blockIdx.x] * (p.v[row + e] - kv);
      float o = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float s = s_col[d * kSlice + lane] + k_s[d] * kv;
        s_col[d * kSlice + lane] = s;
        o += q_s[d] * s;
      }
      p.o[row + e] = o;
    }
    __syncwarp();
  }
  if (active) {
    for (int64_t d = 0; d < dk; ++d) state[d * dv + e] = s_col[d * kSlice + lane];
  }
}

struct ChunkShared {
  double* cum_g;  // [C, K]
  float* a;       // [C, C]
  float* inv;     // [C, C]
  float* a_qk;    // [C, C]
  float* w;       // [C, K]
  float* u;       // [C, kSlice]
  float* s;       // [K, kSlice]
};

size_t chunk_shared_bytes(int64_t chunk, int64_t dk) {
  return sizeof(double) * chunk * dk +
         sizeof(float) * (3 * chunk * chunk + chunk * dk + chunk * kSlice + dk * kSlice);
}

__device__ ChunkShared carve(void* base, int64_t chunk, int64_t dk) {
  ChunkShared sh;
  sh.cum_g = static_cast<double*>(base);
  sh.a = reinterpret_cast<float*>(sh.cum_g + chunk * dk);
  sh.inv = sh.a + chunk * chunk;
  sh.a_qk = sh.inv + chunk * chunk;
  sh.w = sh.a_qk + chunk * chunk;
  sh.u = sh.w + chunk * dk;
  sh.s = sh.u + chunk * kSlice;
  return sh;
}

__global__ void chunked_kernel(KdaParams p, int64_t chunk) {
  extern __shared__ double smem_d[];
  const int64_t dk = p.head_dim;
  const int64_t dv = p.head_dim;
  const int64_t h = blockIdx.x;
  const HeadIndex hi{p.num_heads, p.head_dim, h};
  const int64_t e0 = static_cast<int64_t>(blockIdx.y) * kSlice;
  const int64_t num_cols = dv - e0 < kSlice ? dv - e0 : kSlice;
  const ChunkShared sh = carve(smem_d, chunk, dk);
  float* state = kda_head_state(p, h);
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  auto beta = [&](int64_t t) { return p.beta[t * p.num_heads + h]; };

  for (int64_t i = tid; i < dk * kSlice; i += nthreads) {
    const int64_t d = i / kSlice, el = i % kSlice;
    sh.s[i] = el < num_cols ? state[d * dv + e0 + el] : 0.0f;
  }

  for (int64_t t0 = 0; t0 < p.num_tokens; t0 += chunk) {
    const int64_t n = p.num_tokens - t0 < chunk ? p.num_tokens - t0 : chunk;
    // G in double (see cpu.cpp: fp32 sums lose the low bits after strong decays).
    for (int64_t d = tid; d < dk; d += nthreads) {
      double acc = 0.0;
      for (int64_t c = 0; c < n; ++c) {
        acc += p.g[hi.row(t0 + c) + d];
        sh.cum_g[c * dk + d] = acc;
      }
    }
    __syncthreads();

    // L (strictly lower, times beta_c) and Aqk (lower with the diagonal).
    for (int64_t i = tid; i < n * n; i += nthreads) {
      const int64_t c = i / n, j = i % n;
      if (j > c) continue;
      const float* q = p.q + hi.row(t0 + c);
      const float* kc = p.k + hi.row(t0 + c);
      const float* kj = p.k + hi.row(t0 + j);
      const double* gc = sh.cum_g + c * dk;
      const double* gj = sh.cum_g + j * dk;
      float kk = 0.0f, qk = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float decay = expf(static_cast<float>(gc[d] - gj[d]));
        kk += kc[d] * kj[d] * decay;
        qk += q[d] * kj[d] * decay;
      }
      sh.a[c * n + j] = j < c ? beta(t0 + c) * kk : 0.0f;
      sh.a_qk[c * n + j] = qk;
    }
    __syncthreads();

    // inv = (I+L)^-1: inv[c,j] = [c == j] - sum_{j <= i < c} L[c,i] inv[i,j].
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t j = tid; j <= c; j += nthreads) {
        float acc = 0.0f;
        for (int64_t i = j; i < c; ++i) acc += sh.a[c * n + i] * sh.inv[i * n + j];
        sh.inv[c * n + j] = j == c ? 1.0f : -acc;
      }
      __syncthreads();
    }
    // A = inv diag(beta).
    for (int64_t i = tid; i < n * n; i += nthreads) {
      const int64_t c = i / n, j = i % n;
      if (j <= c) sh.a[i] = sh.inv[i] * beta(t0 + j);
    }
    __syncthreads();

    // W = A (exp(G) * K), U = A V (this block's columns).
    for (int64_t i = tid; i < n * dk; i += nthreads) {
      const int64_t c = i / dk, d = i % dk;
      float acc = 0.0f;
      for (int64_t j = 0; j <= c; ++j) {
        acc += sh.a[c * n + j] * expf(static_cast<float>(sh.cum_g[j * dk + d])) *
               p.k[hi.row(t0 + j) + d];
      }
      sh.w[i] = acc;
    }
    for (int64_t i = tid; i < n * kSlice; i += nthreads) {
      const int64_t c = i / kSlice, el = i % kSlice;
      float acc = 0.0f;
      if (el < num_cols) {
        for (int64_t j = 0; j <= c; ++j) acc += sh.a[c * n + j] * p.v[hi.row(t0 + j) + e0 + el];
      }
      sh.u[i] = acc;
    }
    __syncthreads();

    // V' = U - W S.
    for (int64_t i = tid; i < n * kSlice; i += nthreads) {
      const int64_t c = i / kSlice, el = i % kSlice;
      float u = sh.u[i];
      for (int64_t d = 0; d < dk; ++d) u -= sh.w[c * dk + d] * sh.s[d * kSlice + el];
      sh.u[i] = u;
    }
    __syncthreads();

    // O = (Q * exp(G)) S + Aqk V'.
    for (int64_t i = tid; i < n * kSlice; i += nthreads) {
      const int64_t c = i / kSlice, el = i % kSlice;
      if (el >= num_cols) continue;
      const float* q = p.q + hi.row(t0 + c);
      const double* gc = sh.cum_g + c * dk;
      float o = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        o += q[d] * expf(static_cast<float>(gc[d])) * sh.s[d * kSlice + el];
      }
      for (int64_t j = 0; j <= c; ++j) o += sh.a_qk[c * n + j] * sh.u[j * kSlice + el];
      p.o[hi.row(t0 + c) + e0 + el] = o;
    }
    __syncthreads();

    // S = diag(exp(G_last)) S + (exp(G_last - G) * K)^T V'.
    const double* g_last = sh.cum_g + (n - 1) * dk;
    for (int64_t i = tid; i < dk * kSlice; i += nthreads) {
      const int64_t d = i / kSlice, el = i % kSlice;
      float s = sh.s[i] * expf(static_cast<float>(g_last[d]));
      for (int64_t j = 0; j < n; ++j) {
        const float kjd =
            p.k[hi.row(t0 + j) + d] * expf(static_cast<float>(g_last[d] - sh.cum_g[j * dk + d]));
        s += kjd * sh.u[j * kSlice + el];
      }
      sh.s[i] = s;
    }
    __syncthreads();
  }

  for (int64_t i = tid; i < dk * kSlice; i += nthreads) {
    const int64_t d = i / kSlice, el = i % kSlice;
    if (el < num_cols) state[d * dv + e0 + el] = sh.s[i];
  }
}

void check_kda_params(const KdaParams& p, const char* op) {
  CHECK(p.num_tokens >= 0, op, ": num_tokens = ", p.num_tokens);
  CHECK(p.num_heads > 0 && p.num_heads < 65536, op, ": num_heads = ", p.num_heads);
  CHECK(p.head_dim > 0 && p.head_dim <= kMaxHeadDim, op, ": head_dim = ", p.head_dim,
        " (the CUDA kernels take 1..", kMaxHeadDim, ")");
  CHECK(p.state != nullptr, op, ": null state");
  check_kda_state_rows(p, op);
  if (p.num_tokens == 0) return;
  CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.g != nullptr && p.beta != nullptr &&
            p.o != nullptr,
        op, ": null q, k, v, g, beta or o");
}

dim3 head_slice_grid(const KdaParams& p) {
  return dim3(static_cast<unsigned>(p.num_heads),
              static_cast<unsigned>((p.head_dim + kSlice - 1) / kSlice));
}

}  // namespace

void kda_recurrent(const KdaParams& p, cudaStream_t stream) {
  check_kda_params(p, "kda_recurrent");
  if (p.num_tokens == 0) return;
  const size_t smem = sizeof(float) * (p.head_dim * kSlice + 3 * p.head_dim);
  recurrent_kernel<<<head_slice_grid(p), kSlice, smem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void kda_chunked(const KdaParams& p, cudaStream_t stream, int64_t chunk_size) {
  check_kda_params(p, "kda_chunked");
  CHECK(chunk_size > 0 && chunk_size <= kMaxChunk, "kda_chunked: chunk_size = ", chunk_size,
        " (the CUDA kernel takes 1..", kMaxChunk, ")");
  if (p.num_tokens == 0) return;
  const size_t smem = chunk_shared_bytes(chunk_size, p.head_dim);
  CUDA_CHECK(cudaFuncSetAttribute(chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  chunked_kernel<<<head_slice_grid(p), kChunkThreads, smem, stream>>>(p, chunk_size);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
