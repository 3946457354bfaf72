// CPU cache write and read (params.h).
#pragma once

#include "kernels/cache/params.h"

namespace hyserve::cpu {

void scatter_rows(const ScatterRowsParams& p);
void gather_rows(const GatherRowsParams& p);

}  // namespace hyserve::cpu
