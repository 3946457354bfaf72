// A packed block pool for DSA decode tests (kernels/attention/dsa/params.h), on the host: random
// finite e4m3 latents and index keys, power-of-two key scales, shuffled block tables,
// the layer's pages at non-zero offsets inside each row (another layer's pages before
// them), and random queries. Shared by the CPU and GPU DSA tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention/dsa/params.h"

namespace hyserve::test {

struct DsaTestPool {
  int64_t block_size = 64;
  int64_t num_q = 1;
  int64_t max_context = 0;
  int64_t max_blocks = 0;
  std::vector<int32_t> seq_lens;      // [B]
  std::vector<int32_t> block_tables;  // [B, max_blocks]
  std::vector<uint8_t> pool;          // [num_blocks, row_bytes]
  DsaCache cache;                     // pool pointer set by bind()
  // Queries.
  int64_t index_heads = 32;
  int64_t heads = 16;
  std::vector<uint8_t> q8;     // [B, n_q, Hi, 128]
  std::vector<float> weights;  // [B, n_q, Hi]
  std::vector<float> q_lat;    // [B, n_q, H, 512]
  std::vector<float> q_pe;     // [B, n_q, H, 64]

  int64_t num_requests() const { return static_cast<int64_t>(seq_lens.size()); }
  DsaBatch batch(const int32_t* tables, const int32_t* lens) const {
    return {.block_tables = tables,
            .seq_lens = lens,
            .num_requests = num_requests(),
            .max_blocks = max_blocks,
            .num_q = num_q,
            .max_context = max_context};
  }
  DsaBatch host_batch() const { return batch(block_tables.data(), seq_lens.data()); }
  DsaCache cache_at(const uint8_t* base) const {
    DsaCache c = cache;
    c.pool = base;
    return c;
  }
};

// e4m3 code -> fp32 by table.
inline float e4m3_value(uint8_t code) {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table[code];
}

// A finite e4m3 code (never S.1111.111), over the whole range including subnormals.
inline uint8_t random_e4m3(std::mt19937_64& rng) {
  for (;;) {
    const auto v = static_cast<uint8_t>(rng() & 0xff);
    if ((v & 0x7f) != 0x7f) return v;
  }
}

// Small codes (|v| <= 2^2) so that logits stay moderate whatever the head count.
inline uint8_t random_small_e4m3(std::mt19937_64& rng) {
  const auto mag = static_cast<uint8_t>(rng() % 0x48);  // exponent field <= 8: |v| < 4
  return static_cast<uint8_t>(((rng() & 1) << 7) | mag);
}

inline DsaTestPool make_dsa_test_pool(const std::vector<int32_t>& seq_lens, int64_t block_size,
                                      int64_t num_q, int64_t heads, int64_t index_heads,
                                      uint64_t seed, int64_t extra_context = 0) {
  DsaTestPool t;
  std::mt19937_64 rng(seed);
  t.block_size = block_size;
  t.num_q = num_q;
  t.heads = heads;
  t.index_heads = index_heads;
  t.seq_lens = seq_lens;
  const int32_t longest =
      seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
  t.max_context = longest + extra_context;
  t.max_blocks = std::max<int64_t>(1, (t.max_context + block_size - 1) / block_size);
  const int64_t num_requests = t.num_requests();
  // Every request owns max_blocks blocks (unused ones included), in shuffled order.
  const int64_t num_blocks = std::max<int64_t>(1, num_requests * t.max_blocks);
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  t.block_tables.assign(ids.begin(), ids.begin() + num_requests * t.max_blocks);

  // Row: [other layer's latent page | our latent page | our index page | tail], 256-aligned.
  auto round256 = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t latent_page = round256(block_size * kDsaLatentDim);
  const int64_t index_page = round256(block_size * kDsaIndexKeyBytes);
  t.cache.latent_offset = latent_page;
  t.cache.index_offset = 2 * latent_page;
  t.cache.row_bytes = 2 * latent_page + index_page + 256;
  t.cache.num_blocks = num_blocks;
  t.cache.block_size = static_cast<int32_t>(block_size);
  t.cache.latent_scale = 0.03125f * 1.5f;
  t.pool.resize(static_cast<size_t>(num_blocks * t.cache.row_bytes));
  for (auto& byte : t.pool) byte = random_e4m3(rng);
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    uint8_t* row = t.pool.data() + blk * t.cache.row_bytes;
    for (int64_t i = 0; i < block_size * kDsaLatentDim; ++i) {
      row[t.cache.latent_offset + i] = random_small_e4m3(rng);
    }
    float* scales =
        reinterpret_cast<float*>(row + t.cache.index_offset + block_size * kDsaIndexDim);
    for (int64_t j = 0; j < block_size; ++j) {
      scales[j] = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 12);
    }
  }
  const int64_t rows = num_requests * num_q;
  t.q8.resize(static_cast<size_t>(rows * index_heads * kDsaIndexDim));
  for (auto& v : t.q8) v = random_e4m3(rng);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  t.weights.resize(static_cast<size_t>(rows * index_heads));
  for (auto& v : t.weights) v = uni(rng) * 1e-3f;
  t.q_lat.resize(static_cast<size_t>(rows * heads * kDsaLoraDim));
  for (auto& v : t.q_lat) v = uni(rng);
  t.q_pe.resize(static_cast<size_t>(rows * heads * kDsaRopeDim));
  for (auto& v : t.q_pe) v = uni(rng);
  return t;
}

}  // namespace hyserve::test
