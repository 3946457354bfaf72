// CPU top-k merge steps (params.h): the reference.
#pragma once

#include "kernels/attention/topk_merge/params.h"

namespace hyserve::cpu {

void topk_merge_pack(const TopkMergeParams& p);
void topk_merge_decide(const TopkMergeParams& p);
void topk_merge_resend_pack(const TopkMergeParams& p);
void topk_merge_resend_decide(const TopkMergeParams& p);

}  // namespace hyserve::cpu
