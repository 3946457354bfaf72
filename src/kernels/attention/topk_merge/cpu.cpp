// CPU top-k merge steps; see cpu.h and params.h.
#include "kernels/attention/topk_merge/cpu.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "core/order_key.h"
#include "kernels/attention/topk_merge/check.h"
#include "kernels/attention/topk_merge/verdict.h"
#include "util/error.h"

namespace hyserve::cpu {
namespace {

int64_t stride(const TopkMergeParams& p) {
  return p.candidates + 1;
}

// Round 1's message of rank r for `row`.
const uint32_t* message(const TopkMergeParams& p, int r, int64_t row) {
  return p.gathered + (r * p.rows + row) * stride(p);
}

// The row's selection: the entries of the (ascending) local top-k whose key is among the
// first m of the sorted list, in the same order, -1 padded.
void apply(const TopkMergeParams& p, int64_t row, int64_t m) {
  int32_t* sel = p.selected + row * p.k;
  const float* scores = p.scores + row * p.num_keys;
  const uint64_t cutoff = m > 0 ? p.sorted[row * p.k + m - 1] : 0;
  int64_t out = 0;
  for (int64_t i = 0; i < p.k; ++i) {
    const int32_t pos = sel[i];
    if (pos >= 0 && m > 0 && float_rank_key(scores[pos], pos) >= cutoff) sel[out++] = pos;
  }
  CHECK(out == m, "top-k merge: row ", row, " kept ", out, " entries, expected ", m);
  for (int64_t i = out; i < p.k; ++i) sel[i] = -1;
}

// The keys of a resent list: sorted descending, 0 after the last (a key is never 0).
int64_t valid_keys(const uint64_t* list, int64_t k) {
  return std::partition_point(list, list + k, [](uint64_t key) { return key != 0; }) - list;
}

}  // namespace

void topk_merge_pack(const TopkMergeParams& p) {
  validate(p, TopkMergeStep::kPack);
  std::vector<uint64_t> keys;
  for (int64_t row = 0; row < p.rows; ++row) {
    keys.clear();
    const float* scores = p.scores + row * p.num_keys;
    for (int64_t i = 0; i < p.k; ++i) {
      const int32_t pos = p.selected[row * p.k + i];
      if (pos >= 0) keys.push_back(float_rank_key(scores[pos], pos));
    }
    std::sort(keys.begin(), keys.end(), std::greater<>());
    const auto n = std::ssize(keys);
    uint64_t* sorted = p.sorted + row * p.k;
    uint32_t* msg = p.send + row * stride(p);
    msg[0] = static_cast<uint32_t>(n);
    for (int64_t i = 0; i < p.k; ++i) sorted[i] = i < n ? keys[static_cast<size_t>(i)] : 0;
    for (int64_t i = 0; i < p.candidates; ++i) {
      msg[1 + i] = i < n ? static_cast<uint32_t>(keys[static_cast<size_t>(i)] >> 32) : 0;
    }
  }
}

void topk_merge_decide(const TopkMergeParams& p) {
  validate(p, TopkMergeStep::kDecide);
  const int64_t c = p.candidates, k = p.k;
  int32_t undecided_rows = 0;
  std::vector<uint32_t> keys;
  for (int64_t row = 0; row < p.rows; ++row) {
    if (p.resend_all) {
      p.take[row] = -1;
      ++undecided_rows;
      continue;
    }
    keys.clear();
    for (int r = 0; r < p.world; ++r) {
      const uint32_t* in = message(p, r, row);
      keys.insert(keys.end(), in + 1, in + 1 + std::min<int64_t>(c, in[0]));
    }
    // T: the k-th largest key sent; with at most k keys sent, every one is in.
    const bool all_in = std::ssize(keys) <= k;
    uint32_t threshold = 0;
    if (!all_in) {
      std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<>());
      threshold = keys[static_cast<size_t>(k - 1)];
    }
    const int64_t m = topk_merge_verdict(p.world, p.rank, k, all_in, [&](int r) {
      const uint32_t* in = message(p, r, row);
      TopkMergeCounts n;
      n.sent = std::min<int64_t>(c, in[0]);
      // The unsent keys of r are <= its c-th: they matter when that one is in.
      n.unsent_in = in[0] > c && in[c] >= threshold;
      for (int64_t i = 0; i < n.sent && !all_in; ++i) {
        n.above += in[1 + i] > threshold ? 1 : 0;
        n.tied += in[1 + i] == threshold ? 1 : 0;
      }
      return n;
    });
    if (m < 0) {
      p.take[row] = -1;
      ++undecided_rows;
      continue;
    }
    p.take[row] = static_cast<int32_t>(m);
    apply(p, row, m);
  }
  *p.num_undecided = undecided_rows;
}

void topk_merge_resend_pack(const TopkMergeParams& p) {
  validate(p, TopkMergeStep::kResendPack);
  int64_t j = 0;
  for (int64_t row = 0; row < p.rows; ++row) {
    if (p.take[row] != -1) continue;
    CHECK(j < p.num_resend, "top-k merge: more undecided rows than ", p.num_resend);
    const int64_t n = p.send[row * stride(p)];
    for (int64_t i = 0; i < p.k; ++i) {
      const uint64_t key = p.sorted[row * p.k + i];
      const int64_t local = 0xffffffffu - static_cast<uint32_t>(key);
      p.send2[j * p.k + i] =
          i < n ? (key & 0xffffffff00000000ull) |
                      (0xffffffffu - static_cast<uint32_t>(local * p.world + p.rank))
                : 0;
    }
    ++j;
  }
  CHECK(j == p.num_resend, "top-k merge: ", j, " undecided rows, expected ", p.num_resend);
}

void topk_merge_resend_decide(const TopkMergeParams& p) {
  validate(p, TopkMergeStep::kResendDecide);
  const int64_t k = p.k;
  std::vector<uint64_t> keys;
  int64_t j = 0;
  for (int64_t row = 0; row < p.rows; ++row) {
    if (p.take[row] != -1) continue;
    // The k largest of every rank's whole list (unique keys); this rank's are a prefix
    // of its sorted list.
    keys.clear();
    for (int r = 0; r < p.world; ++r) {
      const uint64_t* list = p.gathered2 + (r * p.num_resend + j) * k;
      keys.insert(keys.end(), list, list + valid_keys(list, k));
    }
    uint64_t kth = 0;
    if (std::ssize(keys) > k) {
      std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<>());
      kth = keys[static_cast<size_t>(k - 1)];
    }
    const uint64_t* mine = p.gathered2 + (p.rank * p.num_resend + j) * k;
    const int64_t n = valid_keys(mine, k);
    int64_t m = 0;
    while (m < n && mine[m] >= kth) ++m;
    apply(p, row, m);
    ++j;
  }
}

}  // namespace hyserve::cpu
