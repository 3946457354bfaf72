// Warp-level bf16 tensor-core MMAs (mma.sync m16n8k16, sm_80+) and the ldmatrix loads
// that feed them from shared memory. Fragment layouts (PTX ISA, "mma.m16n8k16"), with
// g = lane / 4 and c = lane % 4:
//
//   A [16 x 16] row-major:  a0 = (g, 2c..2c+1)    a1 = (g+8, 2c..2c+1)
//                           a2 = (g, 2c+8..+9)    a3 = (g+8, 2c+8..+9)
//   B [16 x 8] (k x n):     b0 = (k 2c..2c+1, n g)    b1 = (k 2c+8..+9, n g)
//   C [16 x 8] fp32:        c0, c1 = (g, 2c..2c+1)    c2, c3 = (g+8, 2c..2c+1)
//
// Each register holds two bf16, the lower column (or k) in the low half. A C fragment of two
// neighbouring n-tiles, rounded to bf16, is the A fragment of a k-step over those 16 columns
// (the flash-attention P operand).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hyserve::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// The same, each matrix transposed on the way (a thread gets rows 2c, 2c+1 of column g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// d += A B, bf16 inputs, fp32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16, packed low half first.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace hyserve::cuda
