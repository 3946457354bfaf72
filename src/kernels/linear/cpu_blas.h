// The CPU linear through OpenBLAS's sgemm (CpuGemm::kBlas in kernels/linear/params.h).
#pragma once

#include "kernels/linear/params.h"

namespace hyserve::cpu {

// y = x W^T (+ bias) by sgemm over blocks of W's rows (decoded to fp32 per block unless W is
// dense fp32), in parallel over the blocks (and over token ranges when the blocks are fewer
// than the threads), one OpenBLAS thread per call. p is checked by linear(); needs
// blas_linked().
void linear_blas(const LinearParams& p);

}  // namespace hyserve::cpu
