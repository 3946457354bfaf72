// CUDA logits processors (params.h), elementwise or one block per row. The fp32 arithmetic
// is written with the _rn intrinsics so that nvcc cannot fuse it into FMAs the CPU op does
// not do: every value is the CPU op's, bit for bit.
//   apply_penalties   grid (logits row, vocab chunk), one thread per id
//   count_tokens      one thread per token, integer atomics (order-independent)
//   adjust_logits     one thread per entry (entries name distinct elements)
//   apply_token_mask  one block per masked row: any id allowed? -> ban the others while
//                     looking for an allowed logit above -inf -> else allowed ids get 0
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/logits/cuda.h"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaskThreads = 512;
constexpr int64_t kMaxGridY = 65535;

__device__ bool mask_bit(const uint32_t* mask_row, int64_t id) {
  return (mask_row[id / kTokenMaskWordBits] >> (id % kTokenMaskWordBits)) & 1u;
}

__global__ void __launch_bounds__(kThreads) penalties_kernel(PenaltyParams p) {
  const int64_t i = blockIdx.x;
  const int64_t r = p.rows[i];
  const float repetition = p.repetition[r];
  const float presence = p.presence[r];
  const float frequency = p.frequency[r];
  const bool repeat = repetition != 1.0f;
  const bool occur = presence != 0.0f || frequency != 0.0f;
  if (!repeat && !occur) return;
  const int32_t* counts = p.output_counts + r * p.vocab;
  const uint32_t* prompt = p.prompt_mask + r * token_mask_words(p.vocab);
  float* logits = p.logits + i * p.vocab;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kThreads;
  for (int64_t id = blockIdx.y * kThreads + threadIdx.x; id < p.vocab; id += stride) {
    const int32_t count = counts[id];
    const bool penalize_repeat = repeat && (count > 0 || mask_bit(prompt, id));
    const bool penalize_occur = occur && count > 0;
    if (!penalize_repeat && !penalize_occur) continue;
    float l = logits[id];
    if (penalize_repeat) {
      l = l > 0.0f ? __fdiv_rn(l, repetition) : __fmul_rn(l, repetition);
    }
    if (penalize_occur) {
      l = __fsub_rn(l, __fadd_rn(presence, __fmul_rn(frequency, static_cast<float>(count))));
    }
    logits[id] = l;
  }
}

__global__ void __launch_bounds__(kThreads) count_kernel(CountTokensParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.num_tokens) return;
  const int32_t r = p.rows[i];
  const int32_t token = p.tokens[i];
  if (r < 0 || token < 0 || token >= p.vocab) return;
  atomicAdd(p.counts + r * p.vocab + token, 1);
}

__global__ void __launch_bounds__(kThreads) adjust_kernel(LogitAdjustParams p) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= p.num_entries) return;
  const int32_t r = p.row[e];
  const int32_t id = p.id[e];
  if (r < 0 || r >= p.num_rows || id < 0 || id >= p.vocab) return;
  float& l = p.logits[r * p.vocab + id];
  l = p.mode == LogitAdjustMode::kAdd ? __fadd_rn(l, p.value[e]) : -INFINITY;
}

__global__ void __launch_bounds__(kMaskThreads) mask_kernel(TokenMaskParams p) {
  const int64_t r = p.rows[blockIdx.x];
  if (r < 0 || r >= p.num_rows) return;
  const int64_t words = token_mask_words(p.vocab);
  const uint32_t* mask = p.mask + blockIdx.x * words;
  float* logits = p.logits + r * p.vocab;

  int any = 0;
  for (int64_t w = threadIdx.x; w < words; w += kMaskThreads) {
    uint32_t bits = mask[w];
    const int64_t valid = p.vocab - w * kTokenMaskWordBits;  // ids of this word below vocab
    if (valid < kTokenMaskWordBits) bits &= (1u << valid) - 1u;
    any |= bits != 0;
  }
  if (!__syncthreads_or(any)) return;

  any = 0;  // an allowed logit above -inf (NaN is not)
  for (int64_t id = threadIdx.x; id < p.vocab; id += kMaskThreads) {
    if (!mask_bit(mask, id)) {
      logits[id] = -INFINITY;
    } else {
      any |= logits[id] > -INFINITY;
    }
  }
  if (__syncthreads_or(any)) return;
  for (int64_t id = threadIdx.x; id < p.vocab; id += kMaskThreads) {
    if (mask_bit(mask, id)) logits[id] = 0.0f;
  }
}

void check_vocab(const char* op, int64_t vocab) {
  CHECK(vocab > 0 && vocab <= INT32_MAX, op, ": vocab ", vocab, " not in [1, 2^31)");
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  CHECK(blocks <= INT32_MAX, "logits: ", n, " items exceed one grid");
  return static_cast<unsigned>(blocks);
}

}  // namespace

void apply_penalties(const PenaltyParams& p, cudaStream_t stream) {
  CHECK(p.num_rows >= 0, "apply_penalties: num_rows ", p.num_rows);
  check_vocab("apply_penalties", p.vocab);
  if (p.num_rows == 0) return;
  CHECK(p.logits && p.rows && p.repetition && p.presence && p.frequency && p.output_counts &&
            p.prompt_mask,
        "apply_penalties: null pointer");
  CHECK(p.num_rows <= INT32_MAX, "apply_penalties: num_rows ", p.num_rows, " over 2^31");
  const dim3 grid(
      static_cast<unsigned>(p.num_rows),
      static_cast<unsigned>(std::min<int64_t>(blocks_for(p.vocab, kThreads), kMaxGridY)));
  penalties_kernel<<<grid, kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void count_tokens(const CountTokensParams& p, cudaStream_t stream) {
  CHECK(p.num_tokens >= 0, "count_tokens: num_tokens ", p.num_tokens);
  check_vocab("count_tokens", p.vocab);
  if (p.num_tokens == 0) return;
  CHECK(p.counts && p.rows && p.tokens, "count_tokens: null pointer");
  count_kernel<<<blocks_for(p.num_tokens, kThreads), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void adjust_logits(const LogitAdjustParams& p, cudaStream_t stream) {
  CHECK(p.num_entries >= 0 && p.num_rows >= 0, "adjust_logits: num_entries ", p.num_entries,
        ", num_rows ", p.num_rows);
  check_vocab("adjust_logits", p.vocab);
  if (p.num_entries == 0) return;
  CHECK(p.logits && p.row && p.id && (p.value || p.mode != LogitAdjustMode::kAdd),
        "adjust_logits: null pointer");
  adjust_kernel<<<blocks_for(p.num_entries, kThreads), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void apply_token_mask(const TokenMaskParams& p, cudaStream_t stream) {
  CHECK(p.num_masked >= 0 && p.num_rows >= 0, "apply_token_mask: num_masked ", p.num_masked,
        ", num_rows ", p.num_rows);
  check_vocab("apply_token_mask", p.vocab);
  if (p.num_masked == 0) return;
  CHECK(p.logits && p.rows && p.mask, "apply_token_mask: null pointer");
  CHECK(p.num_masked <= INT32_MAX, "apply_token_mask: num_masked ", p.num_masked, " over 2^31");
  mask_kernel<<<static_cast<unsigned>(p.num_masked), kMaskThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
