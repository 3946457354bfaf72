#include "parallel/topk_merge.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/order_key.h"
#include "util/error.h"

namespace hyserve::parallel {
namespace {

void check_local(std::span<const LocalCandidates> local, int64_t k) {
  CHECK(k >= 1, "top-k merge: k ", k);
  for (size_t r = 0; r < local.size(); ++r) {
    const LocalCandidates& c = local[r];
    CHECK(c.scores.size() == c.positions.size() && std::ssize(c.scores) <= k, "top-k merge: row ",
          r, " has ", c.scores.size(), " scores, ", c.positions.size(), " positions, k ", k);
  }
}

// Selects the k largest of `keys` (unique); returns their indices into keys.
std::vector<size_t> top_k_of(const std::vector<uint64_t>& keys, int64_t k) {
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto take = std::min<size_t>(order.size(), static_cast<size_t>(k));
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(take), order.end(),
                    [&](size_t a, size_t b) { return keys[a] > keys[b]; });
  order.resize(take);
  return order;
}

// Exact selection from every rank's full lists as 64-bit keys: the indices of `rank`'s.
// all[r * k + i]: rank r's i-th key (count[r] valid).
std::vector<int32_t> select_exact(const uint64_t* all, const std::vector<int64_t>& count, int64_t k,
                                  int rank) {
  std::vector<uint64_t> keys;
  std::vector<std::pair<int, int32_t>> owner;
  for (size_t r = 0; r < count.size(); ++r) {
    for (int64_t i = 0; i < count[r]; ++i) {
      keys.push_back(all[static_cast<int64_t>(r) * k + i]);
      owner.emplace_back(static_cast<int>(r), static_cast<int32_t>(i));
    }
  }
  std::vector<int32_t> mine;
  for (size_t j : top_k_of(keys, k)) {
    if (owner[j].first == rank) mine.push_back(owner[j].second);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

uint64_t rank_key(const LocalCandidates& c, size_t i, int rank, int world) {
  return float_rank_key(c.scores[i], c.positions[i] * world + rank);
}

}  // namespace

int64_t merge_candidates(int64_t k, int world) {
  return std::min<int64_t>(k, (3 * k + 2 * world - 1) / (2 * world));
}

std::vector<std::vector<int32_t>> merge_topk(Communicator& comm,
                                             std::span<const LocalCandidates> local, int64_t k,
                                             TopkMergeStats* stats) {
  check_local(local, k);
  const int world = comm.size(), me = comm.rank();
  const auto rows = static_cast<int64_t>(local.size());
  const int64_t c = merge_candidates(k, world);
  const int64_t stride = c + 1;  // [n_local, keys...]

  // Round 1: the best c order keys and the count of each row.
  std::vector<uint32_t> send(static_cast<size_t>(rows * stride), 0);
  for (int64_t row = 0; row < rows; ++row) {
    const LocalCandidates& lc = local[static_cast<size_t>(row)];
    uint32_t* out = send.data() + row * stride;
    out[0] = static_cast<uint32_t>(lc.scores.size());
    const int64_t n = std::min<int64_t>(c, std::ssize(lc.scores));
    for (int64_t i = 0; i < n; ++i) out[1 + i] = float_order_key(lc.scores[static_cast<size_t>(i)]);
  }
  std::vector<uint32_t> all(send.size() * static_cast<size_t>(world));
  comm.all_gather(send.data(), all.data(), send.size() * 4);
  const auto at = [&](int r, int64_t row) { return all.data() + (r * rows + row) * stride; };

  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(rows));
  std::vector<int64_t> resend;
  std::vector<uint32_t> keys;
  for (int64_t row = 0; row < rows; ++row) {
    keys.clear();
    for (int r = 0; r < world; ++r) {
      const uint32_t* in = at(r, row);
      const int64_t n = std::min<int64_t>(c, in[0]);
      keys.insert(keys.end(), in + 1, in + 1 + n);
    }
    // T: the k-th largest key; with fewer than k keys sent, every key sent is in.
    const bool all_in = std::ssize(keys) <= k;
    uint32_t threshold = 0;
    if (!all_in) {
      std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<>());
      threshold = keys[static_cast<size_t>(k - 1)];
    }
    int64_t num_above = 0, num_tied = 0;
    int tied_ranks = 0, tied_rank = -1;
    bool undecided = false;
    for (int r = 0; r < world; ++r) {
      const uint32_t* in = at(r, row);
      const int64_t n_local = in[0];
      const int64_t n = std::min<int64_t>(c, n_local);
      // Unsent keys of r are <= its c-th: they matter when that one is in.
      if (n_local > c && in[c] >= threshold) undecided = true;
      int64_t tied = 0;
      for (int64_t i = 0; i < n && !all_in; ++i) {
        num_above += in[1 + i] > threshold ? 1 : 0;
        tied += in[1 + i] == threshold ? 1 : 0;
      }
      num_tied += tied;
      if (tied > 0) {
        ++tied_ranks;
        tied_rank = r;
      }
    }
    // Ties at T cut by k across ranks: the positions decide, which round 1 does not carry.
    const int64_t slots = k - num_above;
    const bool all_tied_in = num_tied <= slots;
    if (!all_in && !all_tied_in && tied_ranks > 1) undecided = true;
    if (undecided) {
      resend.push_back(row);
      continue;
    }
    // Decided: keys above T, and of the keys at T the first `slots` (one rank's: its list
    // is in position order among equal scores).
    const uint32_t* in = at(me, row);
    const int64_t n = std::min<int64_t>(c, in[0]);
    int64_t tied_taken = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = in[1 + i];
      const bool take =
          all_in || key > threshold ||
          (key == threshold && (all_tied_in || (tied_rank == me && tied_taken++ < slots)));
      if (take) selected[static_cast<size_t>(row)].push_back(static_cast<int32_t>(i));
    }
  }

  // Round 2: every rank's full list of the undecided rows, as unique 64-bit keys.
  const auto num_resend = static_cast<int64_t>(resend.size());
  if (stats != nullptr) {
    stats->rows += rows;
    stats->resent_rows += num_resend;
    stats->bytes_sent += rows * stride * 4 + num_resend * k * 8;
    stats->bytes_received += world * (rows * stride * 4 + num_resend * k * 8);
  }
  if (num_resend == 0) return selected;
  std::vector<uint64_t> send2(static_cast<size_t>(num_resend * k), 0);
  for (int64_t j = 0; j < num_resend; ++j) {
    const LocalCandidates& lc = local[static_cast<size_t>(resend[static_cast<size_t>(j)])];
    for (size_t i = 0; i < lc.scores.size(); ++i)
      send2[static_cast<size_t>(j * k) + i] = rank_key(lc, i, me, world);
  }
  std::vector<uint64_t> all2(send2.size() * static_cast<size_t>(world));
  comm.all_gather(send2.data(), all2.data(), send2.size() * 8);
  std::vector<uint64_t> rows_keys(static_cast<size_t>(world * k));
  for (int64_t j = 0; j < num_resend; ++j) {
    const int64_t row = resend[static_cast<size_t>(j)];
    std::vector<int64_t> count(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      count[static_cast<size_t>(r)] = std::min<int64_t>(k, at(r, row)[0]);
      std::memcpy(rows_keys.data() + r * k, all2.data() + (r * num_resend + j) * k,
                  static_cast<size_t>(k) * 8);
    }
    selected[static_cast<size_t>(row)] = select_exact(rows_keys.data(), count, k, me);
  }
  return selected;
}

std::vector<std::vector<int32_t>> merge_topk_generic(Communicator& comm,
                                                     std::span<const LocalCandidates> local,
                                                     int64_t k, TopkMergeStats* stats) {
  check_local(local, k);
  const int world = comm.size(), me = comm.rank();
  const auto rows = static_cast<int64_t>(local.size());
  // [score fp32 | position int32] per entry, position -1 past the row's list.
  std::vector<uint32_t> send(static_cast<size_t>(rows * k * 2), 0);
  for (int64_t row = 0; row < rows; ++row) {
    const LocalCandidates& lc = local[static_cast<size_t>(row)];
    uint32_t* out = send.data() + row * k * 2;
    for (int64_t i = 0; i < k; ++i) {
      const bool valid = i < std::ssize(lc.scores);
      out[2 * i] = valid ? std::bit_cast<uint32_t>(lc.scores[static_cast<size_t>(i)]) : 0;
      out[2 * i + 1] =
          valid ? static_cast<uint32_t>(lc.positions[static_cast<size_t>(i)] * world + me)
                : 0xffffffffu;
    }
  }
  std::vector<uint32_t> all(send.size() * static_cast<size_t>(world));
  comm.all_gather(send.data(), all.data(), send.size() * 4);
  if (stats != nullptr) {
    stats->rows += rows;
    stats->bytes_sent += rows * k * 8;
    stats->bytes_received += world * rows * k * 8;
  }
  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(rows));
  std::vector<uint64_t> keys(static_cast<size_t>(world * k));
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<int64_t> count(static_cast<size_t>(world), 0);
    for (int r = 0; r < world; ++r) {
      const uint32_t* in = all.data() + (r * rows + row) * k * 2;
      for (int64_t i = 0; i < k && in[2 * i + 1] != 0xffffffffu; ++i) {
        keys[static_cast<size_t>(r * k + i)] =
            float_rank_key(std::bit_cast<float>(in[2 * i]), in[2 * i + 1]);
        ++count[static_cast<size_t>(r)];
      }
    }
    selected[static_cast<size_t>(row)] = select_exact(keys.data(), count, k, me);
  }
  return selected;
}

TopkMergeParams topk_merge_params(const float* scores, int64_t num_keys, int32_t* selected,
                                  int64_t rows, int64_t k, int rank, int world) {
  TopkMergeParams p;
  p.scores = scores;
  p.num_keys = num_keys;
  p.selected = selected;
  p.rows = rows;
  p.k = k;
  p.candidates = merge_candidates(k, world);
  p.rank = rank;
  p.world = world;
  return p;
}

namespace {

// The scratch pieces in order, bytes each: sorted, send, take, num_undecided, send2,
// gathered, gathered2.
std::vector<size_t> scratch_pieces(const TopkMergeParams& p) {
  const auto rows = static_cast<size_t>(p.rows), k = static_cast<size_t>(p.k);
  const auto stride = static_cast<size_t>(p.candidates + 1), world = static_cast<size_t>(p.world);
  return {
      rows * k * 8,        rows * stride * 4, rows * 4, 4, rows * k * 8, world * rows * stride * 4,
      world * rows * k * 8};
}

size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

size_t merge_scratch_bytes(const TopkMergeParams& p) {
  size_t total = 0;
  for (size_t bytes : scratch_pieces(p)) total += aligned(bytes);
  return total;
}

MergeScratch bind_merge_scratch(TopkMergeParams& p, void* scratch) {
  std::vector<void*> at;
  auto* next = static_cast<uint8_t*>(scratch);
  for (size_t bytes : scratch_pieces(p)) {
    at.push_back(next);
    next += aligned(bytes);
  }
  p.sorted = static_cast<uint64_t*>(at[0]);
  p.send = static_cast<uint32_t*>(at[1]);
  p.take = static_cast<int32_t*>(at[2]);
  p.num_undecided = static_cast<int32_t*>(at[3]);
  p.send2 = static_cast<uint64_t*>(at[4]);
  return {static_cast<uint32_t*>(at[5]), static_cast<uint64_t*>(at[6])};
}

int64_t merge_topk_steps(Backend& backend, Communicator& comm, TopkMergeParams p,
                         uint32_t* gathered, uint64_t* gathered2, TopkMergeStats* stats) {
  CHECK(comm.size() == p.world && comm.rank() == p.rank, "top-k merge: rank ", p.rank, " of ",
        p.world, " on a communicator of rank ", comm.rank(), " of ", comm.size());
  const int64_t stride = p.candidates + 1;
  p.gathered = gathered;
  p.gathered2 = gathered2;
  backend.topk_merge_pack(p);
  if (!p.resend_all) comm.all_gather(p.send, gathered, static_cast<size_t>(p.rows * stride) * 4);
  backend.topk_merge_decide(p);
  int32_t undecided = 0;
  backend.download(&undecided, p.num_undecided, sizeof(undecided));
  CHECK(undecided >= 0 && undecided <= p.rows, "top-k merge: ", undecided, " undecided rows of ",
        p.rows);
  if (undecided > 0) {
    p.num_resend = undecided;
    backend.topk_merge_resend_pack(p);
    comm.all_gather(p.send2, gathered2, static_cast<size_t>(undecided * p.k) * 8);
    backend.topk_merge_resend_decide(p);
  }
  if (stats != nullptr) {
    const int64_t sent = (p.resend_all ? 0 : p.rows * stride * 4) + undecided * p.k * 8;
    stats->rows += p.rows;
    stats->resent_rows += p.resend_all ? 0 : undecided;
    stats->bytes_sent += sent;
    stats->bytes_received += p.world * sent;
  }
  return undecided;
}

}  // namespace hyserve::parallel
