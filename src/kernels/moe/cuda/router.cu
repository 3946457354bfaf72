// CUDA MoE router: logits by linear_gemv, or past 16 tokens by cuBLAS on three bf16 terms
// of x (cuda.h), then one block per token. The per-token
// steps mirror cpu::route_experts: the same float expressions, the same
// (value desc, index asc) order for groups and experts, the weights summed and
// scaled sequentially in slot order.
#include <cuda_bf16.h>
#include <cub/block/block_reduce.cuh>

#include <algorithm>

#include "kernels/moe/cuda.h"
#include "kernels/moe/cuda/split_terms.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGroups = 256;

struct Candidate {
  float value;
  int32_t index;  // -1: none
};

// a before b in (value desc, index asc); a real candidate before none.
__device__ __forceinline__ bool before(const Candidate& a, const Candidate& b) {
  if (a.index < 0) return false;
  if (b.index < 0) return true;
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

struct First {
  __device__ Candidate operator()(const Candidate& a, const Candidate& b) const {
    return before(a, b) ? a : b;
  }
};

// x = x0 + x1 + x2 as bf16 terms (split_terms): terms[i][t, d].
__global__ void split_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ terms) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint16_t t[3];
    moe_internal::split_terms<3>(x[i], t);
    for (int k = 0; k < 3; ++k) terms[k * n + i] = t[k];
  }
}

// logits = partial[0] + partial[1] + partial[2], in that order.
__global__ void sum_terms_kernel(const float* __restrict__ partial, int64_t n,
                                 float* __restrict__ logits) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    logits[i] = (partial[i] + partial[n + i]) + partial[2 * n + i];
  }
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
}

__global__ void __launch_bounds__(kThreads)
    route_kernel(RouterParams p, const float* __restrict__ logits) {
  extern __shared__ float smem[];
  float* score = smem;                      // [E] s
  float* selection = smem + p.num_experts;  // [E] s' = s + bias, -inf once taken
  __shared__ float group_score[kMaxGroups];
  __shared__ bool group_kept[kMaxGroups];
  __shared__ int32_t chosen[64];
  using Reduce = cub::BlockReduce<Candidate, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;

  const int64_t t = blockIdx.x;
  const int64_t num_experts = p.num_experts;
  const int64_t group_size = num_experts / p.n_group;
  int has_nan = 0;
  for (int64_t e = threadIdx.x; e < num_experts; e += kThreads) {
    const float s = 1.0f / (1.0f + expf(-logits[t * num_experts + e]));
    score[e] = s;
    selection[e] = s + (p.bias != nullptr ? p.bias[e] : 0.0f);
    has_nan |= isnan(selection[e]) ? 1 : 0;
  }
  if (__syncthreads_or(has_nan)) {
    for (int64_t i = threadIdx.x; i < p.top_k; i += kThreads) {
      p.expert_ids[t * p.top_k + i] = -1;
      p.expert_weights[t * p.top_k + i] = 0.0f;
    }
    return;
  }

  if (p.n_group > 1) {
    for (int64_t g = threadIdx.x; g < p.n_group; g += kThreads) {
      const int64_t lo = g * group_size;
      Candidate first{selection[lo], static_cast<int32_t>(lo)};
      Candidate second{selection[lo + 1], static_cast<int32_t>(lo + 1)};
      if (before(second, first)) {
        const Candidate tmp_c = first;
        first = second;
        second = tmp_c;
      }
      for (int64_t e = lo + 2; e < lo + group_size; ++e) {
        const Candidate c{selection[e], static_cast<int32_t>(e)};
        if (before(c, first)) {
          second = first;
          first = c;
        } else if (before(c, second)) {
          second = c;
        }
      }
      group_score[g] = first.value + second.value;
      group_kept[g] = false;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int64_t i = 0; i < p.topk_group; ++i) {
        Candidate best{0.0f, -1};
        for (int64_t g = 0; g < p.n_group; ++g) {
          const Candidate c{group_score[g], static_cast<int32_t>(g)};
          if (!group_kept[g] && before(c, best)) best = c;
        }
        group_kept[best.index] = true;
      }
    }
    __syncthreads();
  }

  for (int64_t i = 0; i < p.top_k; ++i) {
    Candidate mine{0.0f, -1};
    for (int64_t e = threadIdx.x; e < num_experts; e += kThreads) {
      const bool eligible = p.n_group == 1 || group_kept[e / group_size];
      bool taken = false;
      for (int64_t j = 0; j < i; ++j) taken |= chosen[j] == e;
      const Candidate c{selection[e], static_cast<int32_t>(e)};
      if (eligible && !taken && before(c, mine)) mine = c;
    }
    const Candidate best = Reduce(tmp).Reduce(mine, First());
    if (threadIdx.x == 0) chosen[i] = best.index;
    __syncthreads();
  }

  if (threadIdx.x == 0) {
    int32_t* ids = p.expert_ids + t * p.top_k;
    float* weights = p.expert_weights + t * p.top_k;
    float sum = 0.0f;
    for (int64_t i = 0; i < p.top_k; ++i) {
      ids[i] = chosen[i];
      weights[i] = score[chosen[i]];
      sum += weights[i];
    }
    for (int64_t i = 0; i < p.top_k; ++i) {
      if (p.renormalize) weights[i] /= sum + 1e-20f;
      weights[i] *= p.scaling_factor;
    }
  }
}

}  // namespace

size_t router_workspace_bytes(int64_t max_tokens, int64_t num_experts, int64_t hidden) {
  CHECK(max_tokens >= 0 && num_experts > 0 && hidden > 0, "router_workspace_bytes: max_tokens ",
        max_tokens, ", num_experts ", num_experts, ", hidden ", hidden);
  const auto logits = static_cast<size_t>(max_tokens * num_experts) * sizeof(float);
  if (max_tokens <= kSmallBatchMaxTokens) return logits;
  // logits, three partial logits, three bf16 terms of x (each region 256-byte aligned)
  const auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  return align(logits) + align(3 * logits) +
         3 * static_cast<size_t>(max_tokens * hidden) * sizeof(__nv_bfloat16);
}

void route_experts(const RouterParams& p, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, const Blas* blas) {
  cpu::check_router_params(p);
  CHECK(p.n_group <= kMaxGroups && p.top_k <= 64, "route_experts: the GPU router handles at most ",
        kMaxGroups, " groups and top_k 64 (n_group ", p.n_group, ", top_k ", p.top_k, ")");
  const size_t smem = static_cast<size_t>(2 * p.num_experts) * sizeof(float);
  CHECK(smem <= 48 * 1024, "route_experts: ", p.num_experts, " experts are too many");
  if (p.num_tokens == 0) return;
  CHECK(p.num_tokens <= INT32_MAX, "route_experts: num_tokens over 2^31");
  const int64_t hidden = p.gate->cols;
  const size_t need = router_workspace_bytes(p.num_tokens, p.num_experts, hidden);
  CHECK(workspace != nullptr && workspace_bytes >= need, "route_experts: workspace of ",
        workspace_bytes, " bytes, ", p.num_tokens, " tokens need ", need);
  auto* logits = static_cast<float*>(workspace);  // [T, E]
  const bool tensor_cores = blas != nullptr && p.num_tokens > kSmallBatchMaxTokens &&
                            p.gate->format == WeightFormat::kDense &&
                            p.gate->dtype == DType::kBF16 && hidden <= INT32_MAX;
  if (tensor_cores) {
    CHECK(blas->stream() == stream, "route_experts: the Blas handle is bound to another stream");
    const int64_t n = p.num_tokens * p.num_experts;
    const auto align = [](size_t b) { return (b + 255) / 256 * 256; };
    auto* base = static_cast<char*>(workspace);
    auto* partial = reinterpret_cast<float*>(base + align(n * sizeof(float)));
    auto* terms =
        reinterpret_cast<uint16_t*>(base + align(n * sizeof(float)) + align(3 * n * sizeof(float)));
    const int64_t nx = p.num_tokens * hidden;
    split_kernel<<<grid_for(nx), kThreads, 0, stream>>>(p.x, nx, terms);
    CUDA_CHECK_LAUNCH();
    // partial[i] [T, E] row-major = terms[i] [T, D] gate[E, D]^T: column-major E x T.
    const float alpha = 1.0f;
    const float beta = 0.0f;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas->handle(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.num_experts),
        static_cast<int>(p.num_tokens), static_cast<int>(hidden), &alpha, p.gate->data, CUDA_R_16BF,
        static_cast<int>(hidden), 0, terms, CUDA_R_16BF, static_cast<int>(hidden), nx, &beta,
        partial, CUDA_R_32F, static_cast<int>(p.num_experts), n, 3, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    sum_terms_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, n, logits);
    CUDA_CHECK_LAUNCH();
  } else {
    linear_gemv({.x = p.x, .w = p.gate, .y = logits, .num_tokens = p.num_tokens}, stream);
  }
  route_kernel<<<static_cast<unsigned>(p.num_tokens), kThreads, smem, stream>>>(p, logits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
