// The device layer itself: buffers round-trip through GPU memory.
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"

namespace hyserve {
namespace {

TEST(GpuDevice, BufferRoundTrip) {
  REQUIRE_GPU();
  const std::vector<float> v = test::random_floats(1000, 1);
  const cuda::DeviceBuffer b = cuda::to_device(v);
  EXPECT_EQ(cuda::to_host<float>(b, v.size()), v);
}

TEST(GpuDevice, OutOfRangeCopyIsRefused) {
  REQUIRE_GPU();
  cuda::DeviceBuffer b(16);
  std::vector<float> v(8);
  EXPECT_THROW(b.upload(v.data(), 32), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
