// CPU attention merge (params.h): the reference.
#pragma once

#include "kernels/attention/merge/params.h"

namespace hyserve::cpu {

void attention_merge(const AttentionMergeParams& p);

}  // namespace hyserve::cpu
