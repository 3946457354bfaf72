// validate(Params) of the DSA decode ops (params.h): what both the CPU reference (cpu.cpp)
// and the CUDA launchers (cuda/*.cu) require, checked on the host before either runs.
// Reads no pointed-to data (on CUDA it is device memory): the CPU op also checks
// seq_lens[b] <= max_context and refuses a visible NaN score as it reads them; the CUDA
// launchers add their own limits (dsa_common.cuh check_cuda_limits: pool alignment, block
// sizes 32..2^20, int32 slot ids, grid sizes; head counts the MMA tiles take; alignment of
// vector loads; workspaces). validate_sizes: the checks that need no buffer, for the
// workspace planning before the buffers exist. Messages name the op and the field.
#pragma once

#include <cmath>

#include "kernels/attention/dsa/params.h"
#include "util/error.h"

namespace hyserve {

inline void validate(const DsaCache& c, const char* op) {
  CHECK(c.pool != nullptr, op, ": null cache pool");
  CHECK(c.block_size > 0 && (c.block_size & (c.block_size - 1)) == 0, op,
        ": cache block_size must be a power of two, got ", c.block_size);
  CHECK(c.row_bytes > 0 && c.row_bytes % 256 == 0, op, ": cache row_bytes ", c.row_bytes,
        " must be a positive multiple of 256");
  CHECK(c.latent_offset >= 0 && c.latent_offset % 256 == 0 && c.index_offset >= 0 &&
            c.index_offset % 256 == 0,
        op, ": cache page offsets (latent_offset ", c.latent_offset, ", index_offset ",
        c.index_offset, ") must be 256-byte aligned");
  CHECK(c.latent_offset + int64_t{c.block_size} * kDsaLatentDim <= c.row_bytes, op,
        ": latent page (latent_offset ", c.latent_offset, ") does not fit the row");
  CHECK(c.index_offset + int64_t{c.block_size} * kDsaIndexKeyBytes <= c.row_bytes, op,
        ": index page (index_offset ", c.index_offset, ") does not fit the row");
  CHECK(c.num_blocks >= 0, op, ": cache num_blocks ", c.num_blocks);
}

// need_pointers false: sizes only (workspace planning).
inline void validate(const DsaBatch& b, const char* op, bool need_pointers = true) {
  CHECK(b.num_requests >= 0, op, ": num_requests ", b.num_requests);
  CHECK(b.num_q >= 1 && b.num_q <= 8, op, ": num_q must be in 1..8, got ", b.num_q);
  CHECK(b.max_context >= 0, op, ": max_context ", b.max_context);
  if (b.num_requests == 0) return;
  CHECK(b.max_blocks > 0, op, ": max_blocks ", b.max_blocks);
  if (need_pointers) {
    CHECK(b.block_tables != nullptr && b.seq_lens != nullptr, op,
          ": null block_tables or seq_lens");
  }
}

inline void validate_softmax_scale(float softmax_scale, const char* op) {
  CHECK(std::isfinite(softmax_scale) && softmax_scale > 0.0f, op, ": softmax_scale ",
        softmax_scale);
}

inline void validate_latent_scale(const DsaCache& c, const char* op) {
  CHECK(std::isfinite(c.latent_scale) && c.latent_scale > 0.0f, op, ": cache latent_scale ",
        c.latent_scale);
}

inline void validate_sizes(const DsaIndexerParams& p) {
  validate(p.batch, "dsa_indexer_scores", /*need_pointers=*/false);
  CHECK(p.num_heads > 0, "dsa_indexer_scores: num_heads ", p.num_heads);
  CHECK(p.score_stride >= p.batch.max_context, "dsa_indexer_scores: score_stride ", p.score_stride,
        " < max_context ", p.batch.max_context);
}

inline void validate(const DsaIndexerParams& p) {
  validate_sizes(p);
  validate(p.batch, "dsa_indexer_scores");
  if (p.batch.num_requests == 0) return;
  validate(p.cache, "dsa_indexer_scores");
  CHECK(p.q8 != nullptr && p.weights != nullptr && p.scores != nullptr,
        "dsa_indexer_scores: null q8, weights or scores");
}

inline void validate_sizes(const DsaTopkParams& p) {
  validate(p.batch, "dsa_topk", /*need_pointers=*/false);
  CHECK(p.topk > 0, "dsa_topk: topk ", p.topk);
  CHECK(p.score_stride >= p.batch.max_context, "dsa_topk: score_stride ", p.score_stride,
        " < max_context ", p.batch.max_context);
  CHECK(p.block_size > 0 && (p.block_size & (p.block_size - 1)) == 0,
        "dsa_topk: block_size must be a power of two, got ", p.block_size);
}

inline void validate(const DsaTopkParams& p) {
  validate_sizes(p);
  validate(p.batch, "dsa_topk");
  if (p.batch.num_requests == 0) return;
  CHECK(p.scores != nullptr && p.slots != nullptr, "dsa_topk: null scores or slots");
}

inline void validate_sizes(const DsaMlaParams& p) {
  validate(p.batch, "dsa_mla_decode", /*need_pointers=*/false);
  CHECK(p.num_heads > 0, "dsa_mla_decode: num_heads ", p.num_heads);
  validate_softmax_scale(p.softmax_scale, "dsa_mla_decode");
  if (p.slots != nullptr) CHECK(p.topk_width > 0, "dsa_mla_decode: topk_width ", p.topk_width);
}

inline void validate(const DsaMlaParams& p) {
  validate_sizes(p);
  validate(p.batch, "dsa_mla_decode");
  if (p.batch.num_requests == 0) return;
  validate(p.cache, "dsa_mla_decode");
  validate_latent_scale(p.cache, "dsa_mla_decode");
  CHECK(p.q_lat != nullptr && p.q_pe != nullptr && p.o_lat != nullptr && p.lse != nullptr,
        "dsa_mla_decode: null q_lat, q_pe, o_lat or lse");
}

inline void validate_sizes(const DsaDecodeParams& p) {
  validate(p.batch, "dsa_decode", /*need_pointers=*/false);
  CHECK(p.topk > 0, "dsa_decode: topk ", p.topk);
  CHECK(p.index_num_heads > 0 && p.num_heads > 0, "dsa_decode: index_num_heads ", p.index_num_heads,
        ", num_heads ", p.num_heads);
  validate_softmax_scale(p.softmax_scale, "dsa_decode");
}

inline void validate(const DsaDecodeParams& p) {
  validate_sizes(p);
  validate(p.batch, "dsa_decode");
  if (p.batch.num_requests == 0) return;
  validate(p.cache, "dsa_decode");
  validate_latent_scale(p.cache, "dsa_decode");
  CHECK(p.index_q8 != nullptr && p.index_weights != nullptr,
        "dsa_decode: null index_q8 or index_weights");
  CHECK(p.q_lat != nullptr && p.q_pe != nullptr && p.o_lat != nullptr && p.lse != nullptr,
        "dsa_decode: null q_lat, q_pe, o_lat or lse");
}

}  // namespace hyserve
