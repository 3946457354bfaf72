// CPU reference of the elementwise steps (params.h).
#pragma once

#include "kernels/elementwise/params.h"

namespace hyserve::cpu {

void residual_add(const ResidualAddParams& p);
void sigmoid_gate(const SigmoidGateParams& p);
void silu_mul(const SiluMulParams& p);
void sigmoid(const SigmoidParams& p);
void scale(const ScaleParams& p);
void mul(const MulParams& p);
void dcp_localize(const DcpLocalizeParams& p);
void copy_2d(const Copy2dParams& p);

}  // namespace hyserve::cpu
