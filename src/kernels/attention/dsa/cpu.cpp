// CPU reference of DSA decode; see cpu.h and params.h.
#include "kernels/attention/dsa/cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention/dsa/check.h"
#include "util/error.h"

namespace hyserve::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The lengths, read on the host (validate reads no data).
void check_seq_lens(const DsaBatch& b, const char* op) {
  for (int64_t r = 0; r < b.num_requests; ++r) {
    CHECK(b.seq_lens[r] >= 0 && b.seq_lens[r] <= b.max_context, op, ": seq_lens[", r,
          "] = ", b.seq_lens[r], " outside 0..max_context ", b.max_context);
  }
}

// Number of keys query i of request b sees: position + 1, clamped at 0.
int64_t num_visible(const DsaBatch& batch, int64_t b, int64_t i) {
  return std::max<int64_t>(0, int64_t{batch.seq_lens[b]} - batch.num_q + i + 1);
}

// e4m3 code -> fp32 by table (the tests run long contexts through this reference).
float decode(uint8_t code) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table[code];
}

}  // namespace

void dsa_indexer_scores(const DsaIndexerParams& p) {
  validate(p);
  check_seq_lens(p.batch, "dsa_indexer_scores");
  const DsaBatch& batch = p.batch;
  const int64_t hi = p.num_heads;
  std::vector<float> q(static_cast<size_t>(hi * kDsaIndexDim));
  std::vector<float> k(kDsaIndexDim);
  for (int64_t b = 0; b < batch.num_requests; ++b) {
    for (int64_t i = 0; i < batch.num_q; ++i) {
      const int64_t row = b * batch.num_q + i;
      for (int64_t j = 0; j < hi * kDsaIndexDim; ++j)
        q[j] = decode(p.q8[row * hi * kDsaIndexDim + j]);
      const float* w = p.weights + row * hi;
      float* out = p.scores + row * p.score_stride;
      const int64_t visible = num_visible(batch, b, i);
      for (int64_t pos = 0; pos < batch.seq_lens[b]; ++pos) {
        if (pos >= visible) {
          out[pos] = kNegInf;
          continue;
        }
        const int64_t slot = dsa_slot(batch, p.cache.block_size, b, pos);
        const uint8_t* codes = dsa_index_codes(p.cache, slot);
        for (int d = 0; d < kDsaIndexDim; ++d) k[d] = decode(codes[d]);
        float acc = 0.0f;
        for (int64_t h = 0; h < hi; ++h) {
          float dot = 0.0f;
          for (int d = 0; d < kDsaIndexDim; ++d) dot += q[h * kDsaIndexDim + d] * k[d];
          acc += w[h] * std::max(dot, 0.0f);
        }
        out[pos] = *dsa_index_scale(p.cache, slot) * acc;
        if (p.histogram != nullptr) {
          ++p.histogram[row * kDsaTopkBins + (float_order_key(out[pos]) >> kDsaTopkBinShift)];
        }
      }
    }
  }
}

void dsa_topk(const DsaTopkParams& p) {
  validate(p);
  check_seq_lens(p.batch, "dsa_topk");
  const DsaBatch& batch = p.batch;
  std::vector<int32_t> keys;
  for (int64_t b = 0; b < batch.num_requests; ++b) {
    for (int64_t i = 0; i < batch.num_q; ++i) {
      const int64_t row = b * batch.num_q + i;
      const float* s = p.scores + row * p.score_stride;
      const int64_t n = num_visible(batch, b, i);
      for (int64_t pos = 0; pos < n; ++pos) {
        CHECK(!std::isnan(s[pos]), "dsa_topk: NaN score at request ", b, ", query ", i,
              ", position ", pos);
      }
      const int64_t keep = std::min(p.topk, n);
      keys.resize(static_cast<size_t>(n));
      for (int64_t pos = 0; pos < n; ++pos) keys[pos] = static_cast<int32_t>(pos);
      std::partial_sort(keys.begin(), keys.begin() + keep, keys.end(), [&](int32_t a, int32_t c) {
        return s[a] > s[c] || (s[a] == s[c] && a < c);
      });
      std::sort(keys.begin(), keys.begin() + keep);
      int32_t* slots = p.slots + row * p.topk;
      int32_t* positions = p.positions != nullptr ? p.positions + row * p.topk : nullptr;
      for (int64_t j = 0; j < p.topk; ++j) {
        const bool taken = j < keep;
        slots[j] = taken ? static_cast<int32_t>(dsa_slot(batch, p.block_size, b, keys[j])) : -1;
        if (positions != nullptr) positions[j] = taken ? keys[j] : -1;
      }
    }
  }
}

void dsa_mla_decode(const DsaMlaParams& p) {
  validate(p);
  check_seq_lens(p.batch, "dsa_mla_decode");
  if (p.batch.num_requests == 0) return;
  const DsaBatch& batch = p.batch;
  const float scale = p.cache.latent_scale;
  std::vector<int64_t> slots;
  std::vector<float> logits;
  std::vector<float> keys;
  std::vector<float> o(kDsaLoraDim);
  for (int64_t b = 0; b < batch.num_requests; ++b) {
    for (int64_t i = 0; i < batch.num_q; ++i) {
      const int64_t row = b * batch.num_q + i;
      slots.clear();
      if (p.slots != nullptr) {
        for (int64_t j = 0; j < p.topk_width; ++j) {
          const int32_t s = p.slots[row * p.topk_width + j];
          if (s >= 0) slots.push_back(s);
        }
      } else {
        const int64_t n = num_visible(batch, b, i);
        for (int64_t pos = 0; pos < n; ++pos) {
          slots.push_back(dsa_slot(batch, p.cache.block_size, b, pos));
        }
      }
      // The query's keys, dequantized once: codes [n, 576] (latent_scale applied last).
      const int64_t n = static_cast<int64_t>(slots.size());
      keys.resize(static_cast<size_t>(n * kDsaLatentDim));
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* codes = dsa_latent_row(p.cache, slots[j]);
        for (int d = 0; d < kDsaLatentDim; ++d) keys[j * kDsaLatentDim + d] = decode(codes[d]);
      }
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const int64_t qh = row * p.num_heads + h;
        float* out = p.o_lat + qh * kDsaLoraDim;
        if (n == 0) {
          std::fill_n(out, kDsaLoraDim, 0.0f);
          p.lse[qh] = kNegInf;
          continue;
        }
        const float* q_lat = p.q_lat + qh * kDsaLoraDim;
        const float* q_pe = p.q_pe + qh * kDsaRopeDim;
        logits.resize(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
          const float* c = &keys[j * kDsaLatentDim];
          float dot = 0.0f;
          for (int d = 0; d < kDsaLoraDim; ++d) dot += q_lat[d] * c[d];
          for (int d = 0; d < kDsaRopeDim; ++d) dot += q_pe[d] * c[kDsaLoraDim + d];
          logits[j] = dot * scale * p.softmax_scale;
        }
        const float max_logit = *std::max_element(logits.begin(), logits.end());
        float sum = 0.0f;
        for (float& l : logits) {
          l = std::exp(l - max_logit);
          sum += l;
        }
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float* c = &keys[j * kDsaLatentDim];
          const float w = logits[j] / sum;
          for (int d = 0; d < kDsaLoraDim; ++d) o[d] += w * c[d];
        }
        for (int d = 0; d < kDsaLoraDim; ++d) out[d] = o[d] * scale;
        p.lse[qh] = max_logit + std::log(sum);
      }
    }
  }
}

void dsa_decode(const DsaDecodeParams& p) {
  validate(p);
  check_seq_lens(p.batch, "dsa_decode");
  if (p.batch.num_requests == 0) return;
  const int64_t rows = p.batch.num_requests * p.batch.num_q;
  std::vector<float> scores(static_cast<size_t>(rows * std::max<int64_t>(p.batch.max_context, 1)));
  std::vector<int32_t> own_slots;
  int32_t* slots = p.slots;
  if (slots == nullptr) {
    own_slots.resize(static_cast<size_t>(rows * p.topk));
    slots = own_slots.data();
  }
  dsa_indexer_scores({.cache = p.cache,
                      .batch = p.batch,
                      .q8 = p.index_q8,
                      .weights = p.index_weights,
                      .num_heads = p.index_num_heads,
                      .scores = scores.data(),
                      .score_stride = p.batch.max_context});
  dsa_topk({.batch = p.batch,
            .block_size = p.cache.block_size,
            .scores = scores.data(),
            .score_stride = p.batch.max_context,
            .topk = p.topk,
            .slots = slots,
            .positions = nullptr});
  dsa_mla_decode({.cache = p.cache,
                  .batch = p.batch,
                  .q_lat = p.q_lat,
                  .q_pe = p.q_pe,
                  .slots = slots,
                  .topk_width = p.topk,
                  .num_heads = p.num_heads,
                  .softmax_scale = p.softmax_scale,
                  .o_lat = p.o_lat,
                  .lse = p.lse});
}

}  // namespace hyserve::cpu
