// The BPE merge loop shared by both tokenizers: repeatedly merge the adjacent pair with the
// lowest rank, the leftmost one among equal ranks, until no adjacent pair has a rank.
//
// This is the rule of tiktoken's byte_pair_merge and of tokenizers' Word::merge_all. A heap of
// candidate pairs (stale entries skipped when popped) keeps it O(n log n), so a long run of
// one letter (one regex piece) cannot stall the server as the quadratic scan would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace hyserve {

// `pair_rank(left, right)` returns {rank, merged symbol} for a pair that merges, else nullopt.
// A pair whose two symbols are unchanged must keep its rank (true when the rank depends only
// on the symbols' contents).
template <typename Symbol, typename PairRank>
std::vector<Symbol> merge_by_rank(std::vector<Symbol> symbols, PairRank pair_rank) {
  const std::size_t n = symbols.size();
  if (n < 2) return symbols;
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> next(n), prev(n);
  std::vector<uint32_t> version(n, 0);  // bumped when the symbol at an index changes
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : kNone;
    prev[i] = i > 0 ? i - 1 : kNone;
  }
  struct Candidate {
    int32_t rank;
    std::size_t left;  // index of the left symbol: its position order
    uint32_t left_version;
    uint32_t right_version;
    Symbol merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](std::size_t left) {
    if (left == kNone || next[left] == kNone) return;
    const std::size_t right = next[left];
    if (auto merge = pair_rank(symbols[left], symbols[right])) {
      heap.push({merge->first, left, version[left], version[right], std::move(merge->second)});
    }
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    const std::size_t left = top.left;
    const std::size_t right = next[left];
    if (!alive[left] || right == kNone || version[left] != top.left_version ||
        version[right] != top.right_version) {
      continue;
    }
    symbols[left] = std::move(top.merged);
    ++version[left];
    alive[right] = false;
    next[left] = next[right];
    if (next[right] != kNone) prev[next[right]] = left;
    push_pair(prev[left]);
    push_pair(left);
  }
  std::vector<Symbol> out;
  for (std::size_t i = 0; i != kNone; i = next[i]) out.push_back(std::move(symbols[i]));
  return out;
}

}  // namespace hyserve
