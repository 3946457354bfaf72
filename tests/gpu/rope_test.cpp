// CUDA RoPE against the CPU op. The angle float(pos) * inv_freq is one IEEE product
// on both sides and the rotation uses the same separately rounded products; cosf /
// sinf on the GPU are within 2 ulp, the host's within 1: outputs of magnitude ~3 differ
// by < 1e-5 (abs tolerance 1e-5, rel 1e-6). Dims outside the rotated range stay bitwise.
#include <cuda_runtime_api.h>

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/rope/cpu.h"
#include "kernels/rope/cuda.h"

namespace hyserve {
namespace {

struct Case {
  int64_t tokens, heads, head_stride, offset;
};

const Case kCases[] = {{0, 2, 64, 0},  {1, 1, 64, 0},  {3, 3, 96, 32},
                       {63, 1, 80, 8}, {65, 4, 64, 0}, {321, 2, 72, 4}};

void check(const RopeTable& table, bool neox) {
  const cuda::DeviceRopeTable dt = cuda::DeviceRopeTable::upload(table);
  uint64_t seed = neox ? 500 : 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE("T=" + std::to_string(c.tokens) + " heads=" + std::to_string(c.heads) +
                 " stride=" + std::to_string(c.head_stride) +
                 " offset=" + std::to_string(c.offset));
    const std::vector<float> x =
        test::random_floats(c.tokens * c.heads * c.head_stride, seed++, -3.0f, 3.0f);
    std::vector<int64_t> pos(c.tokens);
    std::mt19937_64 rng(seed++);
    for (auto& p : pos) p = static_cast<int64_t>(rng() % 200000);
    if (!pos.empty()) pos[0] = 0;
    std::vector<float> want = x;
    const RopeParams hp{.x = want.data(),
                        .positions = pos.data(),
                        .num_tokens = c.tokens,
                        .num_heads = c.heads,
                        .head_stride = c.head_stride,
                        .offset = c.offset};
    neox ? cpu::apply_rope_neox(table, hp) : cpu::apply_rope_interleaved(table, hp);
    cuda::DeviceBuffer dx = cuda::to_device(x);
    const cuda::DeviceBuffer dpos = cuda::to_device(pos);
    RopeParams dp = hp;
    dp.x = dx.as<float>();
    dp.positions = dpos.as<int64_t>();
    neox ? cuda::apply_rope_neox(dt, dp, nullptr) : cuda::apply_rope_interleaved(dt, dp, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = cuda::to_host<float>(dx, x.size());
    EXPECT_TRUE(test::all_close(got, want, 1e-5f, 1e-6f));
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t d = static_cast<int64_t>(i) % c.head_stride;
      if (d < c.offset || d >= c.offset + table.rotary_dim) {
        ASSERT_EQ(got[i], x[i]) << i;
      }
    }
  }
}

TEST(GpuRope, InterleavedPlainMatchesCpu) {
  REQUIRE_GPU();
  check(RopeTable::plain(64, 10000.0), false);
}

TEST(GpuRope, NeoxPlainMatchesCpu) {
  REQUIRE_GPU();
  check(RopeTable::plain(64, 10000.0), true);
}

TEST(GpuRope, YarnWithAttentionFactorMatchesCpu) {
  REQUIRE_GPU();
  YarnParams y;
  y.factor = 40.0;
  y.original_max_position_embeddings = 4096;
  y.mscale = 1.0;
  y.mscale_all_dim = 0.707;
  const RopeTable table = RopeTable::yarn(64, 10000.0, y);
  ASSERT_NE(table.attention_factor, 1.0f);
  check(table, false);
  check(table, true);
}

TEST(GpuRope, RefusesBadShapes) {
  REQUIRE_GPU();
  const cuda::DeviceRopeTable dt = cuda::DeviceRopeTable::upload(RopeTable::plain(64, 10000.0));
  cuda::DeviceBuffer d(1024);
  const RopeParams p{.x = d.as<float>(),
                     .positions = d.as<int64_t>(),
                     .num_tokens = 1,
                     .num_heads = 1,
                     .head_stride = 64,
                     .offset = 1};
  EXPECT_THROW(cuda::apply_rope_neox(dt, p, nullptr), InvalidArgument);
  EXPECT_THROW(cuda::apply_rope_interleaved(cuda::DeviceRopeTable{}, p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
