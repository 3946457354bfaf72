// Token sampling over a batch of logit rows, one row per request, with per-row
// options. Both backends (cpu.h, cuda.h) draw the SAME token for the same row and
// options, because everything after three correctly rounded IEEE double operations is
// integer arithmetic defined in this header:
//
//   greedy (temperature 0): the largest logit; ties: the lower id; NaN never wins.
//   otherwise, over the non-NaN ids:
//     weight   W_i = floor(2^31 exp(x_i)), x_i = (l_i - l_max) * (1 / temperature) in double
//              (a subtraction and a product, never fused: no contraction can differ),
//              exp evaluated in fixed point (token_weight): W_max = 2^31; a token below
//              ~4.7e-10 of the top probability gets weight 0 and is never drawn.
//     rank     ids ordered by (logit desc, id asc), by the bits of the logit
//              (core/order_key.h: -0 and +0 tie, so the lower id ranks first).
//     top-k    keep the first top_k ranks (0: off).
//     top-p    of those, keep the shortest rank prefix whose weight sum reaches
//              ceil(top_p * their total) (1: off).
//     min-p    of those, keep W_i >= ceil(min_p * 2^31) (min_p * p_max; 0: off).
//     draw     r = floor(u * total kept weight), u = draw_bits(seed, step) / 2^53; the
//              token is the first id (ascending) whose running kept-weight sum
//              exceeds r.
// The row index is deliberately not in the hash: a request's tokens depend on its
// seed and step only, not on where it sits in the batch.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "core/order_key.h"

namespace hyserve {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy; else finite and > 0
  int32_t top_k = 0;         // >= 0; 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  uint64_t seed = 0;
  uint64_t step = 0;  // index of the token being drawn within its request
};

struct SampleParams {
  const float* logits = nullptr;             // [num_rows, vocab]
  const SamplingOptions* options = nullptr;  // [num_rows]
  int32_t* tokens = nullptr;                 // [num_rows] out
  int64_t num_rows = 0;
  int64_t vocab = 0;  // in [1, kMaxSamplingVocab]
  // sampling::sample_workspace_bytes(num_rows, vocab) of device scratch for the CUDA
  // sampler (each row's fixed-point weights, bins and bookkeeping); the CPU sampler ignores it.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Optional host copy of options (the CUDA sampler then skips the filter passes no row
  // asks for); null: every pass runs.
  const SamplingOptions* host_options = nullptr;
};

// tokens[i] = source[source_rows[i]] for each i < num_rows with source_rows[i] >= 0 (the
// others keep their value): a step's input ids from the ids an earlier step sampled.
struct GatherTokensParams {
  int32_t* tokens = nullptr;             // [num_rows]
  const int32_t* source = nullptr;       // sampled ids
  const int32_t* source_rows = nullptr;  // [num_rows] row of source, or -1
  int64_t num_rows = 0;
};

// The kept weights of a row sum to < 2^53, so u * total fits scale_draw.
inline constexpr int64_t kMaxSamplingVocab = int64_t{1} << 21;

namespace sampling {

// The CUDA sampler's workspace (kernels/sampling/cuda/sampling.cu): per row, the weights
// [vocab] uint32, its state, the chunks' maxima, kSampleBins bins (count uint32, weight
// uint64), the chunks' kept sums and a list of kSampleListCap 16-byte entries; each part
// 256-byte aligned. A row is split into sample_chunks(rows, vocab) chunks (one block each).
inline constexpr int kSampleBins = 4096;
inline constexpr int kMaxSampleChunks = 64;
inline constexpr int kSampleListCap = 4096;
inline constexpr int64_t kSampleStateBytes = 256;

struct SampleRowLayout {
  int64_t weights, state, partials, bin_counts, bin_weights, chunk_sums, list, row_bytes;
};

constexpr SampleRowLayout sample_row_layout(int64_t vocab) {
  const auto up = [](int64_t n) { return (n + 255) / 256 * 256; };
  SampleRowLayout l{};
  l.weights = 0;
  l.state = up(vocab * 4);
  l.partials = l.state + kSampleStateBytes;
  l.bin_counts = l.partials + up(kMaxSampleChunks * 8);
  l.bin_weights = l.bin_counts + up(kSampleBins * 4);
  l.chunk_sums = l.bin_weights + up(kSampleBins * 8);
  l.list = l.chunk_sums + up(kMaxSampleChunks * 8);
  l.row_bytes = l.list + up(kSampleListCap * 16);
  return l;
}

constexpr int64_t sample_workspace_bytes(int64_t num_rows, int64_t vocab) {
  return num_rows * sample_row_layout(vocab).row_bytes;
}

// Chunks per row: about eight blocks per SM of an H100 (132 SMs) over the batch, at least
// 2,048 ids a chunk, at most kMaxSampleChunks. The per-row passes are latency-bound loops of
// one load per thread and iteration, so the bandwidth they reach grows with the threads in
// flight: two blocks per SM (the first choice) read a batch of 64 rows at ~0.1 of the copy
// rate. The token never depends on it (integer sums, id order).
inline constexpr int64_t kSampleTargetBlocks = 8 * 132;
constexpr int32_t sample_chunks(int64_t num_rows, int64_t vocab) {
  const int64_t by_vocab = (vocab + 2047) / 2048;
  const int64_t by_batch = (kSampleTargetBlocks + num_rows - 1) / (num_rows > 0 ? num_rows : 1);
  int64_t c = by_vocab < by_batch ? by_vocab : by_batch;
  c = c < kMaxSampleChunks ? c : kMaxSampleChunks;
  return static_cast<int32_t>(c > 0 ? c : 1);
}

inline constexpr int kWeightBits = 31;
inline constexpr uint64_t kMaxWeight = uint64_t{1} << kWeightBits;

constexpr bool options_valid(const SamplingOptions& o) {
  return o.temperature >= 0.0f && o.temperature <= 3.4028234663852886e38f && o.top_k >= 0 &&
         o.top_p > 0.0f && o.top_p <= 1.0f && o.min_p >= 0.0f && o.min_p <= 1.0f;
}

constexpr uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 53 uniform bits for draw `step` of the request seeded `seed`.
constexpr uint64_t draw_bits(uint64_t seed, uint64_t step) {
  return splitmix64(splitmix64(seed) ^ step) >> 11;
}

// floor(a * b / 2^53) for a, b < 2^53, in 32-bit limbs.
constexpr uint64_t scale_draw(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32;
  const uint64_t b_lo = b & 0xffffffffu, b_hi = b >> 32;
  const uint64_t lo_lo = a_lo * b_lo;
  const uint64_t mid = a_hi * b_lo + a_lo * b_hi + (lo_lo >> 32);
  const uint64_t lo = (mid << 32) | (lo_lo & 0xffffffffu);
  const uint64_t hi = a_hi * b_hi + (mid >> 32);
  return (hi << 11) | (lo >> 53);
}

// ceil(f * n) for f in [0, 1], n < 2^53: one double product, then integer rounding up.
constexpr uint64_t ceil_mul(float f, uint64_t n) {
  const double d = static_cast<double>(f) * static_cast<double>(n);
  const auto t = static_cast<uint64_t>(d);
  return static_cast<double>(t) < d ? t + 1 : t;
}

// Unique per token; larger means earlier in the rank order (logit desc, id asc; -0 and +0
// tie: core/order_key.h).
HYSERVE_HOST_DEVICE inline uint64_t rank_key(float logit, int64_t id) {
  return float_rank_key(logit, id);
}

// exp(g / 2^30) * 2^30 for g in [0, ln2 * 2^30]: Horner over floor(2^30 / k!), k <= 12.
constexpr uint64_t exp_q30(uint64_t g) {
  constexpr uint64_t kCoef[13] = {1073741824, 1073741824, 536870912, 178956970, 44739242,
                                  8947848,    1491308,    213044,    26630,     2958,
                                  295,        26,         2};
  uint64_t acc = kCoef[12];
  for (int k = 11; k >= 0; --k) acc = kCoef[k] + ((acc * g) >> 30);
  return acc;
}

// 1 / temperature, the factor token_weight takes.
constexpr double inverse_temperature(float temperature) {
  return 1.0 / static_cast<double>(temperature);
}

// W = floor(2^31 exp((logit - max_logit) * inv_temperature)) in fixed point; logit <=
// max_logit, neither NaN. x is taken in Q24 and 2^(-x log2 e) split into 2^-m * e^g.
constexpr uint64_t token_weight(float logit, float max_logit, double inv_temperature) {
  if (logit == max_logit) return kMaxWeight;
  const double x = (static_cast<double>(logit) - static_cast<double>(max_logit)) * inv_temperature;
  // Below -23 the weight is 0 (2^31 e^-23 < 1; n >= 33 below), so the work is skipped.
  if (!(x > -23.0)) return 0;
  constexpr uint64_t kLog2eQ32 = 6196328019u;             // log2(e) * 2^32
  constexpr uint64_t kLn2Q30 = 744261118u;                // ln(2) * 2^30
  const auto a = static_cast<uint64_t>(-x * 16777216.0);  // -x in Q24, < 2^30
  const uint64_t b = (a * kLog2eQ32) >> 24;               // -x log2(e) in Q32
  const uint64_t n = b >> 32;
  const uint64_t frac = b & 0xffffffffu;
  if (frac == 0) {
    const uint64_t e = exp_q30(0);
    return n == 0 ? e << 1 : (n - 1 >= 63 ? 0 : e >> (n - 1));
  }
  const uint64_t m = n + 1;  // 2^-(n + frac) = 2^-m * 2^(1 - frac)
  const uint64_t g = (((uint64_t{1} << 32) - frac) * kLn2Q30) >> 32;
  const uint64_t e = exp_q30(g);
  return m - 1 >= 63 ? 0 : e >> (m - 1);
}

}  // namespace sampling
}  // namespace hyserve
