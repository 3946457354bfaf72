// The decode-context-parallel pieces on the GPU against the CPU ops: dcp_localize (integer
// arithmetic: equal) and attention_merge (expf / logf: rel 1e-6), with parts that hold no
// key (lse -inf), rows where every part is empty, and awkward widths.
#include <cuda_runtime_api.h>

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "kernels/attention/merge/cpu.h"
#include "kernels/attention/merge/cuda.h"
#include "kernels/elementwise/cpu.h"
#include "kernels/elementwise/cuda.h"

namespace hyserve {
namespace {

TEST(GpuDcp, LocalizeMatchesCpu) {
  REQUIRE_GPU();
  for (const int64_t size : {1, 2, 3, 8}) {
    for (int64_t rank = 0; rank < size; ++rank) {
      const int64_t n = 1000;
      std::vector<int64_t> pos(n), slots(n);
      for (int64_t i = 0; i < n; ++i) {
        pos[i] = (i * 7919) % 4099;
        slots[i] = i % 5 == 0 ? -1 : 3 * i + 1;
      }
      std::vector<int64_t> want_pos(n), want_slot(n);
      cpu::dcp_localize(
          {pos.data(), slots.data(), n, rank, size, want_pos.data(), want_slot.data()});
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(want_pos[i], pos[i] >= rank ? (pos[i] - rank) / size : -1);
        ASSERT_EQ(want_slot[i], pos[i] % size == rank ? slots[i] : -1);
      }
      const cuda::DeviceBuffer dp = cuda::to_device(pos), ds = cuda::to_device(slots);
      cuda::DeviceBuffer lp(n * 8), ls(n * 8);
      cuda::dcp_localize(
          {dp.as<int64_t>(), ds.as<int64_t>(), n, rank, size, lp.as<int64_t>(), ls.as<int64_t>()},
          nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(cuda::to_host<int64_t>(lp, n), want_pos);
      EXPECT_EQ(cuda::to_host<int64_t>(ls, n), want_slot);
    }
  }
}

TEST(GpuDcp, AttentionMergeMatchesCpu) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t parts : {1, 2, 3, 8}) {
    for (const int64_t width : {1, 63, 128, 512}) {
      SCOPED_TRACE(testing::Message() << parts << " parts, width " << width);
      const int64_t rows = 97;
      const std::vector<float> values = test::random_floats(parts * rows * width, 5 + width, -3, 3);
      std::vector<float> lses = test::random_floats(parts * rows, 7 + parts, -20, 20);
      for (int64_t r = 0; r < rows; ++r) {
        if (r % 7 == 0) lses[r] = -inf;  // part 0 empty
        if (r % 11 == 0)
          for (int64_t j = 0; j < parts; ++j) lses[j * rows + r] = -inf;  // all empty
      }
      std::vector<float> want(rows * width), want_lse(rows);
      cpu::attention_merge(
          {values.data(), lses.data(), parts, rows, width, want.data(), want_lse.data()});
      for (int64_t r = 0; r < rows; r += 11) {
        ASSERT_EQ(want_lse[r], -inf);
        ASSERT_EQ(want[r * width], 0.0f);
      }
      const cuda::DeviceBuffer dv = cuda::to_device(values), dl = cuda::to_device(lses);
      cuda::DeviceBuffer out(rows * width * 4), out_lse(rows * 4);
      cuda::attention_merge({dv.as<float>(), dl.as<float>(), parts, rows, width, out.as<float>(),
                             out_lse.as<float>()},
                            nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(test::all_close(cuda::to_host<float>(out, rows * width), want, 1e-6f, 1e-5f));
      const std::vector<float> got_lse = cuda::to_host<float>(out_lse, rows);
      for (int64_t r = 0; r < rows; ++r) {
        if (std::isinf(want_lse[r])) {
          EXPECT_EQ(got_lse[r], want_lse[r]) << r;
        } else {
          EXPECT_NEAR(got_lse[r], want_lse[r], 1e-5f * (1 + std::fabs(want_lse[r]))) << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace hyserve
