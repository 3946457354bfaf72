// validate(Params, step) of the top-k merge steps (params.h): what both the CPU steps
// (cpu.cpp) and the CUDA launchers (cuda/topk_merge.cu) require, checked on the host before
// either runs. One Params serves the four steps; each step needs its own buffers. The
// launchers add only their grid and shared-memory limits.
#pragma once

#include "kernels/attention/topk_merge/params.h"
#include "util/error.h"

namespace hyserve {

enum class TopkMergeStep { kPack, kDecide, kResendPack, kResendDecide };

inline const char* topk_merge_op_name(TopkMergeStep step) {
  switch (step) {
    case TopkMergeStep::kPack:
      return "topk_merge_pack";
    case TopkMergeStep::kDecide:
      return "topk_merge_decide";
    case TopkMergeStep::kResendPack:
      return "topk_merge_resend_pack";
    case TopkMergeStep::kResendDecide:
      return "topk_merge_resend_decide";
  }
  return "topk_merge";
}

inline void validate(const TopkMergeParams& p, TopkMergeStep step) {
  const char* op = topk_merge_op_name(step);
  CHECK(p.k >= 1 && p.k <= kTopkMergeMaxK, op, ": k ", p.k, " (1..", kTopkMergeMaxK, ")");
  CHECK(p.candidates >= 1 && p.candidates <= p.k, op, ": candidates ", p.candidates,
        " (1..k = ", p.k, ")");
  CHECK(p.world >= 1 && p.rank >= 0 && p.rank < p.world, op, ": rank ", p.rank, " of world ",
        p.world);
  CHECK(p.rows >= 0 && p.num_keys >= 0, op, ": rows ", p.rows, ", num_keys ", p.num_keys);
  CHECK(p.num_resend >= 0 && p.num_resend <= p.rows, op, ": num_resend ", p.num_resend,
        " outside 0..rows ", p.rows);
  // The steps that apply a selection read the scores at the selected positions.
  const bool scores_ok = p.scores != nullptr || p.num_keys == 0;
  switch (step) {
    case TopkMergeStep::kPack:
      if (p.rows == 0) return;
      CHECK(scores_ok && p.selected != nullptr && p.sorted != nullptr && p.send != nullptr, op,
            ": null scores, selected, sorted or send");
      return;
    case TopkMergeStep::kDecide:
      CHECK(p.num_undecided != nullptr, op, ": null num_undecided");
      if (p.rows == 0) return;
      CHECK(p.take != nullptr, op, ": null take");
      if (p.resend_all) return;
      CHECK(scores_ok && p.gathered != nullptr && p.selected != nullptr && p.sorted != nullptr, op,
            ": null scores, gathered, selected or sorted");
      return;
    case TopkMergeStep::kResendPack:
      if (p.rows == 0) return;
      CHECK(p.take != nullptr, op, ": null take");
      if (p.num_resend == 0) return;
      CHECK(p.send != nullptr && p.sorted != nullptr && p.send2 != nullptr, op,
            ": null send, sorted or send2");
      return;
    case TopkMergeStep::kResendDecide:
      if (p.rows == 0) return;
      CHECK(p.take != nullptr, op, ": null take");
      if (p.num_resend == 0) return;
      CHECK(scores_ok && p.gathered2 != nullptr && p.selected != nullptr && p.sorted != nullptr, op,
            ": null scores, gathered2, selected or sorted");
      return;
  }
}

}  // namespace hyserve
