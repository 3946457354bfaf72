// CPU cache write (params.h).
#pragma once

#include "kernels/cache/params.h"

namespace hyserve::cpu {

void scatter_rows(const ScatterRowsParams& p);

}  // namespace hyserve::cpu
