// validate(Params) of the lightning indexer ops (params.h): what both the CPU op (cpu.cpp)
// and the CUDA launcher (cuda/*.cu) require, checked on the host before either runs. Reads
// no pointed-to data (on CUDA it is device memory); the launchers add only their grid and
// shared-memory limits. Messages name the op and the field.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/attention/indexer/params.h"
#include "util/error.h"

namespace hyserve {

inline void validate(const HadamardParams& p) {
  CHECK(p.dim > 0 && (p.dim & (p.dim - 1)) == 0,
        "hadamard_rotate: dim (the Hadamard size) must be a power of two, got ", p.dim);
  CHECK(p.rows >= 0, "hadamard_rotate: rows ", p.rows);
  if (p.rows > 0) CHECK(p.x != nullptr, "hadamard_rotate: null x");
}

inline void validate(const QuantizeFp8Ue8m0Params& p) {
  CHECK(p.rows >= 0 && p.dim > 0, "quantize_fp8_ue8m0: rows ", p.rows, ", dim ", p.dim);
  if (p.rows > 0) {
    CHECK(p.x != nullptr && p.q != nullptr && p.scales != nullptr,
          "quantize_fp8_ue8m0: null x, q or scales");
  }
}

namespace detail {

// The fields IndexerScoreParams and IndexerFp8CacheScoreParams share.
template <typename Params>
void validate_indexer_scores(const Params& p, const char* op, bool fp8) {
  CHECK(p.num_tokens >= 0 && p.num_keys >= 0, op, ": num_tokens ", p.num_tokens, ", num_keys ",
        p.num_keys);
  CHECK(p.num_heads > 0 && p.head_dim > 0, op, ": num_heads ", p.num_heads, ", head_dim ",
        p.head_dim);
  CHECK(p.table_stride >= 0, op, ": table_stride ", p.table_stride);
  if (fp8) {
    CHECK(p.head_dim <= kIndexerFp8BlockSize, op,
          ": the FP8 indexer takes head_dim <= ", kIndexerFp8BlockSize,
          " (one scale per key), got ", p.head_dim);
  }
  if (p.k_pages.paged()) {
    CHECK(p.k_pages.block_size > 0 && p.k_pages.block_stride_bytes > 0, op, ": k_pages block_size ",
          p.k_pages.block_size, ", block_stride_bytes ", p.k_pages.block_stride_bytes);
  }
  if (p.num_tokens == 0) return;
  CHECK(p.q != nullptr && p.head_weights != nullptr && p.q_pos != nullptr &&
            (p.scores != nullptr || p.num_keys == 0),
        op, ": null q, head_weights, q_pos or scores");
}

}  // namespace detail

inline void validate(const IndexerScoreParams& p) {
  detail::validate_indexer_scores(p, "indexer_scores", p.fp8);
  if (p.num_tokens > 0 && p.num_keys > 0) CHECK(p.k != nullptr, "indexer_scores: null k");
}

inline void validate(const IndexerFp8CacheScoreParams& p) {
  detail::validate_indexer_scores(p, "indexer_scores_fp8_cache", /*fp8=*/true);
  if (p.num_tokens > 0 && p.num_keys > 0) {
    CHECK(p.k_fp8 != nullptr && p.k_scales != nullptr,
          "indexer_scores_fp8_cache: null k_fp8 or k_scales");
  }
}

// A visible NaN score is refused by the CPU op only (it reads the scores on the host).
inline void validate(const CausalTopkParams& p) {
  CHECK(p.num_queries >= 0 && p.num_keys >= 0 && p.topk > 0, "causal_topk: num_queries ",
        p.num_queries, ", num_keys ", p.num_keys, ", topk ", p.topk);
  CHECK(p.num_keys <= std::numeric_limits<int32_t>::max(), "causal_topk: num_keys ", p.num_keys,
        " does not fit int32 positions");
  if (p.num_queries == 0) return;
  CHECK(p.q_pos != nullptr && p.out != nullptr, "causal_topk: null q_pos or out");
  if (p.num_keys > 0) CHECK(p.scores != nullptr, "causal_topk: null scores");
}

}  // namespace hyserve
