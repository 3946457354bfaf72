// CUDA fused KDA decode (cuda.h kda_decode, params.h KdaDecodeParams): one block per
// (request, head) runs the short convs, the gate, beta, the q/k l2norm, the delta rule
// and the gated output RMSNorm over the request's few new tokens, so a decode step's KDA
// core is one launch that reads and writes each state once.
//
// The head's [K, V] state (64 KiB at K = 128, contiguous) is copied into shared memory
// with cp.async at the start, so its loads are in flight while the block runs the convs
// and the gate, and goes back from there at the end. Through a pass's tokens it lives in
// registers: warp w's lane takes column e = (w % 4) * 32 + lane and rows (w / 4) * 32 +
// [0, 32), 32 values per thread (conflict-free shared-memory rows). Per token, S^T k and S^T q are
// four partial sums per column (one per row group) added in shared memory in row-group order. The
// per-token vectors (q, k, v after the conv, exp(g), beta, o) go through shared memory 8 tokens at
// a time. Without write_state (speculative verification) nothing goes back; without y the
// outputs are not written (the commit of the accepted tokens). The sums' order differs from the
// CPU's (one running sum over the rows), so results differ from cpu::kda_decode by fp32 rounding.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/cp_async.cuh"
#include "kernels/kda/check.h"
#include "kernels/kda/cuda.h"
#include "kernels/kda/cuda/check_params.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kDim = static_cast<int>(kKdaMaxHeadDim);
constexpr int kColGroups = kDim / 32;            // 4 groups of 32 columns
constexpr int kRowGroups = kWarps / kColGroups;  // 4 groups of rows
constexpr int kRowsPerThread = kDim / kRowGroups;
constexpr int kTok = 8;  // tokens per pass through shared memory
constexpr float kSoftplusThreshold = 20.0f;
constexpr float kL2NormEps = 1e-6f;

static_assert(kColGroups * 32 == kDim && kRowGroups * kRowsPerThread == kDim);

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Channel c of q, k or v (which) of a request's head: its raw inputs, taps and conv
// state ([W-1] strided by the layer's width).
struct ConvChannel {
  const float* raw;  // the request's first token, this channel
  const float* weight;
  float* state;
  int64_t width;
  int state_rows;  // W-1
  int which, c;
  // The conv's input at the request's new token src (negative: from the conv state).
  __device__ float input(int src) const {
    return src < 0 ? state[(src + state_rows) * width] : raw[src * width];
  }
};

__device__ ConvChannel conv_channel(const KdaDecodeParams& p, int64_t r, int64_t head_col,
                                    int tid) {
  const int dim = static_cast<int>(p.head_dim);
  const int which = tid / dim, c = tid % dim;
  const int64_t width = p.num_heads * p.head_dim, channel = head_col + c;
  ConvChannel ch;
  ch.which = which;
  ch.c = c;
  ch.width = width;
  ch.state_rows = static_cast<int>(p.kernel_size) - 1;
  ch.raw = (which == 0   ? p.q
            : which == 1 ? p.k
                         : p.v) +
           kda_decode_first_token(p, r) * width + channel;
  ch.weight = (which == 0   ? p.conv_weight[0]
               : which == 1 ? p.conv_weight[1]
                            : p.conv_weight[2]) +
              channel * p.kernel_size;
  ch.state = nullptr;
  if (p.kernel_size > 1) {
    float* base = which == 0 ? p.conv_state[0] : which == 1 ? p.conv_state[1] : p.conv_state[2];
    ch.state = reinterpret_cast<float*>(kda_decode_row(p, base, r)) + channel;
  }
  return ch;
}

__device__ float* head_state(const KdaDecodeParams& p, int64_t r, int64_t head_col) {
  return reinterpret_cast<float*>(kda_decode_row(p, p.state, r)) + head_col * p.head_dim;
}

// Whether the state moves in 16-byte pieces (cp.async in, float4 out).
__device__ bool vector_copy(const float* state, int state_floats) {
  return state_floats % 4 == 0 && reinterpret_cast<uintptr_t>(state) % 16 == 0;
}

struct Shared {
  float state[kDim * kDim];  // the head's state as stored ([K, V], K * K floats used)
  float qkv[3][kTok][kDim];  // q, k, v after the conv (q, k then l2-normed); 0 past K
  float decay[kTok][kDim];   // exp(g)
  float o[kTok][kDim];
  float beta[kTok];
  float part_kv[kRowGroups][kDim];  // row groups' partial sums of S^T k
  float part_o[kRowGroups][kDim];   // and of S^T q
};

__global__ void __launch_bounds__(kThreads, 2) kda_decode_kernel(KdaDecodeParams p) {
  extern __shared__ float4 smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  const int h = static_cast<int>(blockIdx.x);
  const int64_t r = blockIdx.y;
  const int n = static_cast<int>(kda_decode_row_tokens(p, r));
  if (n <= 0) return;
  const int64_t t0 = kda_decode_first_token(p, r);
  const int dim = static_cast<int>(p.head_dim);
  const int heads = static_cast<int>(p.num_heads);
  const int64_t width = static_cast<int64_t>(heads) * dim;
  const int64_t head_col = static_cast<int64_t>(h) * dim;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int e = (warp % kColGroups) * 32 + lane;
  const int group = warp / kColGroups;
  const int d0 = group * kRowsPerThread;

  // The state's copy first: nothing below waits for it until the recurrence.
  const int state_floats = dim * dim;
  float* state = head_state(p, r, head_col);
  const bool copy16 = vector_copy(state, state_floats);
  if (copy16) {
    for (int i = 4 * tid; i < state_floats; i += 4 * kThreads) cp_async_16(sh.state + i, state + i);
    cp_async_commit();
  } else {
    for (int i = tid; i < state_floats; i += kThreads) sh.state[i] = state[i];
  }

  // Columns past K stay 0 in the per-token vectors (so rows past K add nothing).
  if (dim < kDim) {
    for (int i = tid; i < kTok * kDim; i += kThreads) {
      if (i % kDim >= dim) {
        const int t = i / kDim, d = i % kDim;
        sh.qkv[0][t][d] = sh.qkv[1][t][d] = sh.qkv[2][t][d] = 0.0f;
        sh.decay[t][d] = 0.0f;
      }
    }
  }

  // Thread tid < 3K runs the conv of channel c of q, k or v (which = tid / K); its
  // pointers are found where they are used (fewer registers live through the tokens).
  const bool conv_thread = tid < 3 * dim;
  const int taps = static_cast<int>(p.kernel_size), num_state = taps - 1;

  for (int base = 0; base < n; base += kTok) {
    const int m = min(kTok, n - base);
    if (conv_thread) {
      const ConvChannel ch = conv_channel(p, r, head_col, tid);
      for (int t = 0; t < m; ++t) {
        float acc = 0.0f;
        for (int i = 0; i < taps; ++i) acc += ch.weight[i] * ch.input(base + t - num_state + i);
        sh.qkv[ch.which][t][ch.c] = acc * sigmoid(acc);
      }
    }
    if (tid < dim) {
      const float rate = expf(p.a_log[h]);
      for (int t = 0; t < m; ++t) {
        const int64_t col = (t0 + base + t) * width + head_col + tid;
        const float x = p.f[col] + p.dt_bias[head_col + tid];
        const float g = p.lower_bound < 0.0f
                            ? p.lower_bound / (1.0f + expf(-rate * x))
                            : -rate * (x > kSoftplusThreshold ? x : log1pf(expf(x)));
        sh.decay[t][tid] = expf(g);
      }
    }
    if (tid < m) sh.beta[tid] = sigmoid(p.b[(t0 + base + tid) * heads + h]);
    __syncthreads();

    // q = l2norm(q) * K^-0.5, k = l2norm(k): a warp per (token, q or k).
    for (int row = warp; row < 2 * m; row += kWarps) {
      float* x = sh.qkv[row % 2][row / 2];
      float sum_sq = 0.0f;
      for (int d = lane; d < dim; d += 32) sum_sq += x[d] * x[d];
      const float scale = row % 2 == 0 ? 1.0f / sqrtf(static_cast<float>(dim)) : 1.0f;
      const float factor = scale / sqrtf(warp_sum(sum_sq) + kL2NormEps);
      for (int d = lane; d < dim; d += 32) x[d] *= factor;
    }
    if (base == 0) cp_async_wait<0>();  // this thread's copies of the state landed
    __syncthreads();
    // This thread's part of the state in registers for the pass's tokens.
    float s[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      s[i] = e < dim && d0 + i < dim ? sh.state[(d0 + i) * dim + e] : 0.0f;
    }

    for (int t = 0; t < m; ++t) {
      const float* q = sh.qkv[0][t] + d0;
      const float* k = sh.qkv[1][t] + d0;
      const float* decay = sh.decay[t] + d0;
      float kv = 0.0f;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        s[i] *= decay[i];
        kv += k[i] * s[i];
      }
      sh.part_kv[group][e] = kv;
      __syncthreads();
      float sum = 0.0f;
#pragma unroll
      for (int g = 0; g < kRowGroups; ++g) sum += sh.part_kv[g][e];
      const float u = sh.beta[t] * (sh.qkv[2][t][e] - sum);
      float o = 0.0f;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        s[i] += k[i] * u;
        o += q[i] * s[i];
      }
      sh.part_o[group][e] = o;
      __syncthreads();
      if (group == 0) {
        float out = 0.0f;
#pragma unroll
        for (int g = 0; g < kRowGroups; ++g) out += sh.part_o[g][e];
        sh.o[t][e] = out;
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      if (e < dim && d0 + i < dim) sh.state[(d0 + i) * dim + e] = s[i];
    }
    __syncthreads();

    // y = rmsnorm(o) * o_norm * sigmoid(gate): a warp per token (none without y).
    for (int t = warp; p.y != nullptr && t < m; t += kWarps) {
      const float* o = sh.o[t];
      float sum_sq = 0.0f;
      for (int d = lane; d < dim; d += 32) sum_sq += o[d] * o[d];
      const float inv_rms = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(dim) + p.eps);
      const int64_t row = (t0 + base + t) * width + head_col;
      for (int d = lane; d < dim; d += 32) {
        p.y[row + d] = o[d] * inv_rms * p.o_norm[d] * sigmoid(p.gate[row + d]);
      }
    }
    __syncthreads();
  }

  // The conv state becomes the last W-1 inputs (ascending rows read rows not yet
  // rewritten, as on the CPU), the state its new value; neither without write_state.
  if (!p.write_state) return;
  if (conv_thread) {
    const ConvChannel ch = conv_channel(p, r, head_col, tid);
    for (int i = 0; i < num_state; ++i) ch.state[i * ch.width] = ch.input(n - num_state + i);
  }
  if (copy16) {
    for (int i = 4 * tid; i < state_floats; i += 4 * kThreads) {
      *reinterpret_cast<float4*>(state + i) = *reinterpret_cast<const float4*>(sh.state + i);
    }
  } else {
    for (int i = tid; i < state_floats; i += kThreads) state[i] = sh.state[i];
  }
}

}  // namespace

void kda_decode(const KdaDecodeParams& p, cudaStream_t stream) {
  check_kda_decode_params(p);
  CHECK(p.head_dim <= kKdaMaxHeadDim, "kda_decode: head_dim = ", p.head_dim,
        " (the CUDA kernels take 1..", kKdaMaxHeadDim, ")");
  CHECK(p.num_heads < 65536 && p.num_rows < 65536, "kda_decode: num_heads = ", p.num_heads,
        ", num_rows = ", p.num_rows, " (grid limits 65535)");
  if (p.num_rows == 0 || p.num_tokens == 0) return;
  CUDA_CHECK(cudaFuncSetAttribute(kda_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(sizeof(Shared))));
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_rows));
  kda_decode_kernel<<<grid, kThreads, sizeof(Shared), stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
