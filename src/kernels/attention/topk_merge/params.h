// The exact top-k merge of decode context parallelism (parallel/topk_merge.h, where the
// algorithm and its traffic are described) as backend ops, so that it runs where the
// indexer's scores are (device memory on CUDA), with the communicator's all_gathers
// between the steps:
//
//   1. topk_merge_pack           per row, the local top-k sorted into 64-bit keys
//                                (float_rank_key of the score and the local position) and
//                                round 1's message: [number of local keys, best c keys as
//                                32-bit float_order_key]
//      all_gather(send -> gathered)                       [world, rows, c + 1] uint32
//   2. topk_merge_decide         per row, the threshold of round 1; a decided row gets
//                                this rank's share of the global top-k written into
//                                `selected` and take[row] = how many of its sorted keys;
//                                an undecided row gets take[row] = -1. *num_undecided =
//                                the number of undecided rows.
//   3. topk_merge_resend_pack    (only when num_undecided > 0: the caller reads it) the
//                                undecided rows' whole sorted lists, in row order, as
//                                64-bit keys of the global position (local * world + rank)
//      all_gather(send2 -> gathered2)                     [world, R, k] uint64
//   4. topk_merge_resend_decide  the undecided rows' share, from every rank's whole list
//                                (sorted, 0 after its last key: a key is never 0)
//
// `selected` holds, on entry, the local top-k as causal_topk writes it (ascending local
// positions, -1 padded) and, after the last step, this rank's entries of the global top-k
// in the same form. Every rank runs the same steps with the same rows, k and world; the
// result equals parallel::merge_topk's (and the single-rank top-k) exactly.
#pragma once

#include <cstdint>

namespace hyserve {

// The largest k the ops take (the DSA indexer's top-2048).
inline constexpr int64_t kTopkMergeMaxK = 2048;

struct TopkMergeParams {
  const float* scores = nullptr;  // [rows, num_keys]: this rank's scores of its local keys
  int64_t num_keys = 0;
  int32_t* selected = nullptr;  // [rows, k] in / out (above)
  int64_t rows = 0;
  int64_t k = 0;           // 1 .. kTopkMergeMaxK
  int64_t candidates = 0;  // c = parallel::merge_candidates(k, world)
  int rank = 0;
  int world = 1;
  uint64_t* sorted = nullptr;           // [rows, k] (pack writes; the other steps read)
  uint32_t* send = nullptr;             // [rows, c + 1] (pack writes)
  const uint32_t* gathered = nullptr;   // [world, rows, c + 1]: every rank's send
  int32_t* take = nullptr;              // [rows] (decide writes; -1 stays on resent rows)
  int32_t* num_undecided = nullptr;     // [1] (decide writes)
  int64_t num_resend = 0;               // R: the value decide wrote (steps 3 and 4)
  uint64_t* send2 = nullptr;            // [R, k] (resend_pack writes)
  const uint64_t* gathered2 = nullptr;  // [world, R, k]: every rank's send2
  // Every row takes round 2 (decide reads no message and decides no row): the generic
  // merge, every rank's whole top-k as 8-byte keys (score and position), for comparison.
  bool resend_all = false;
};

}  // namespace hyserve
