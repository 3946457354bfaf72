// Hopper warpgroup MMA (wgmma, sm_90a) with operands in shared memory (and A in registers):
// the shared-memory matrix descriptors of the 128-byte-swizzled layouts, the e4m3 x e4m3 -> f32
// MMAs of the DSA indexer, the f16 x f16 -> f32 MMAs of sparse MLA, the bf16 x bf16 -> f32 MMAs
// of the MoE prefill experts and the MLA flash prefill, and the fences around them.
//
// The 128-byte swizzle, K-major (both operands, as FP8 wgmma requires): a matrix of rows
// of 128 bytes (= 128 e4m3 along K) in atoms of 8 rows (1,024 bytes, 1,024-aligned); the
// 16-byte chunk c of row r lies at r * 128 + ((c ^ (r % 8)) * 16). One MMA takes K = 32
// (bytes [32s, 32s + 32) of every row for k-step s): its descriptor is the matrix's plus
// 32s bytes, and the hardware applies the swizzle to the resulting addresses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hyserve::cuda {

// Where 16-byte chunk `chunk` (0..7) of row `row` lies in a 128-byte-swizzled matrix of
// 128-byte rows at `rows` (the layout above), and the byte offset of byte `byte`
// (0..127) of row `row` in such a matrix.
__device__ __forceinline__ uint8_t* sw128_chunk(uint8_t* rows, int row, int chunk) {
  return rows + row * 128 + ((chunk ^ (row & 7)) << 4);
}
__device__ __forceinline__ int sw128_offset(int row, int byte) {
  return row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
}

// Descriptor of a 128B-swizzled K-major matrix at `smem` (1,024-aligned, or that plus
// 32s for k-step s): start address / 16 in bits 0-13, stride between 8-row atoms (1,024
// bytes) / 16 in bits 32-45, the leading offset (unused by this layout) 1, layout 128B
// swizzle (1) in bits 62-63.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* smem) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return (uint64_t{1} << 62) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 16) |
         ((addr & 0x3ffffu) >> 4);
}

// Descriptor of a 128B-swizzled MN-major matrix (the MN dimension contiguous within a
// 128-byte row, K along the rows): rows of 128 bytes in atoms of 8 K-rows (1,024
// bytes); panel_bytes apart, the panels of the next 128 bytes of MN (the leading offset);
// 1,024 between groups of 8 K-rows (the stride offset).
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(const void* smem, uint32_t panel_bytes) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return (uint64_t{1} << 62) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{(panel_bytes & 0x3ffffu) >> 4} << 16) | ((addr & 0x3ffffu) >> 4);
}

// Orders this thread's generic-proxy writes to shared memory (st.shared, cp.async) before
// later async-proxy reads (wgmma operands); a barrier then publishes them to the group.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier of the `threads` threads that use barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Before the first wgmma that writes registers other instructions touched.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups are in flight; `d` (the accumulators) is
// tied to the wait so that no read of it moves above.
template <int kPending, int kRegs>
__device__ __forceinline__ void wgmma_wait(float (&d)[kRegs]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A * B^T over one k-step: A 64 x 32 e4m3 (descriptor a), B kN x 32 e4m3
// (descriptor b), d the 64 x kN f32 tile in the wgmma accumulator layout: warp w of the
// group, lane (g = lane / 4, t = lane % 4) holds d[4n + 0, 1] = rows 16w + g, columns
// 8n + 2t, +1 and d[4n + 2, 3] = row 16w + g + 8, the same columns. accumulate 0 = d is
// overwritten.
template <int kN>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[kN / 2], uint64_t a, uint64_t b,
                                           int accumulate);

template <>
__device__ __forceinline__ void wgmma_e4m3<16>(float (&d)[8], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, "
      "%9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<48>(float (&d)[24], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, "
      "1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (+)= A * B over one k-step of 16, f16 operands from shared memory, f32 accumulators
// in the layout of wgmma_e4m3. qk: A K-major (64 x 16), B K-major (32 rows of 16).
__device__ __forceinline__ void wgmma_f16_n32_kmajor(float (&d)[16], uint64_t a, uint64_t b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}

// The accumulator operands of the m64nN MMAs below: d[0 .. N / 2) as "+f" operands %0 ..,
// and the register list of the instruction text.
#define HYSERVE_WGMMA_D8(i)                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define HYSERVE_WGMMA_D32 \
  HYSERVE_WGMMA_D8(0), HYSERVE_WGMMA_D8(8), HYSERVE_WGMMA_D8(16), HYSERVE_WGMMA_D8(24)
#define HYSERVE_WGMMA_D64                                                               \
  HYSERVE_WGMMA_D8(0), HYSERVE_WGMMA_D8(8), HYSERVE_WGMMA_D8(16), HYSERVE_WGMMA_D8(24), \
      HYSERVE_WGMMA_D8(32), HYSERVE_WGMMA_D8(40), HYSERVE_WGMMA_D8(48), HYSERVE_WGMMA_D8(56)
#define HYSERVE_WGMMA_D128                                                                      \
  HYSERVE_WGMMA_D64, HYSERVE_WGMMA_D8(64), HYSERVE_WGMMA_D8(72), HYSERVE_WGMMA_D8(80),          \
      HYSERVE_WGMMA_D8(88), HYSERVE_WGMMA_D8(96), HYSERVE_WGMMA_D8(104), HYSERVE_WGMMA_D8(112), \
      HYSERVE_WGMMA_D8(120)
#define HYSERVE_WGMMA_R32                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define HYSERVE_WGMMA_R64                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "  \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define HYSERVE_WGMMA_R128                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "      \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "      \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "      \
  "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "      \
  "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, "  \
  "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, " \
  "%119, %120, %121, %122, %123, %124, %125, %126, %127}"

template <>
__device__ __forceinline__ void wgmma_e4m3<256>(float (&d)[128], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " HYSERVE_WGMMA_R128
      ", %128, %129, p, 1, 1;\n}\n"
      : HYSERVE_WGMMA_D128
      : "l"(a), "l"(b), "r"(accumulate));
}

// pv: A K-major (64 x 16), B N-major (16 rows of K x 256 columns, the N dimension
// contiguous: trans-b).
__device__ __forceinline__ void wgmma_f16_n256_nmajor(float (&d)[128], uint64_t a, uint64_t b,
                                                      int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " HYSERVE_WGMMA_R128
      ", %128, %129, p, 1, 1, 0, 1;\n}\n"
      : HYSERVE_WGMMA_D128
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (+)= A * B^T over one k-step of 16, bf16 operands from shared memory, both K-major
// (A 64 x 16, B kN rows of 16; descriptors of wgmma_desc_sw128 plus 32 bytes per k-step),
// f32 accumulators in the layout of wgmma_e4m3.
template <int kN>
__device__ __forceinline__ void wgmma_bf16(float (&d)[kN / 2], uint64_t a, uint64_t b,
                                           int accumulate);

template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[16], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HYSERVE_WGMMA_R32
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : HYSERVE_WGMMA_D32
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_bf16<128>(float (&d)[64], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HYSERVE_WGMMA_R64
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : HYSERVE_WGMMA_D64
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_bf16<256>(float (&d)[128], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " HYSERVE_WGMMA_R128
      ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : HYSERVE_WGMMA_D128
      : "l"(a), "l"(b), "r"(accumulate));
}

// The bf16 form of wgmma_f16_n256_nmajor: A K-major (64 x 16) from shared memory, B N-major
// (16 K-rows of 256 columns, trans-b).
__device__ __forceinline__ void wgmma_bf16_n256_nmajor(float (&d)[128], uint64_t a, uint64_t b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " HYSERVE_WGMMA_R128
      ", %128, %129, p, 1, 1, 0, 1;\n}\n"
      : HYSERVE_WGMMA_D128
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (+)= A * B^T over one k-step of 16, bf16: A 64 x 16 from registers (the fragment of
// wgmma_bf16_rs_n128_nmajor below), B K-major from shared memory (64 rows of 16: a
// wgmma_desc_sw128 descriptor plus 32 bytes per k-step), f32 accumulators in the layout of
// wgmma_e4m3.
__device__ __forceinline__ void wgmma_bf16_rs_n64_kmajor(float (&d)[32], const uint32_t (&a)[4],
                                                         uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HYSERVE_WGMMA_R32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : HYSERVE_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// d (+)= A * B over one k-step of 16, bf16: A 64 x 16 from registers (warp w of the group,
// lane (g, t) holds the mma.sync m16n8k16 A fragment of rows 16w ..+16: a[0] = (16w + g,
// 2t ..+1), a[1] = (16w + g + 8, 2t ..+1), a[2], a[3] the same rows at 2t + 8 ..+9; two
// neighbouring n-tiles of an accumulator, rounded, are one such fragment), B N-major from
// shared memory (16 K-rows of 128 columns: wgmma_desc_sw128_mn, trans-b), f32 accumulators in
// the layout of wgmma_e4m3.
__device__ __forceinline__ void wgmma_bf16_rs_n128_nmajor(float (&d)[64], const uint32_t (&a)[4],
                                                          uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HYSERVE_WGMMA_R64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : HYSERVE_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

#undef HYSERVE_WGMMA_D8
#undef HYSERVE_WGMMA_D32
#undef HYSERVE_WGMMA_R32
#undef HYSERVE_WGMMA_D64
#undef HYSERVE_WGMMA_D128
#undef HYSERVE_WGMMA_R64
#undef HYSERVE_WGMMA_R128

}  // namespace hyserve::cuda
