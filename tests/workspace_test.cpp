// Workspace: the forward pass's bump allocator over backend memory.
#include "model/workspace.h"

#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "util/error.h"

namespace hyserve {
namespace {

TEST(Workspace, TakesAreAlignedDisjointAndRewindReuses) {
  auto backend = make_cpu_backend();
  Workspace ws(backend.get());
  ws.reset();
  float* a = ws.floats(3);
  int32_t* b = ws.ints(5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);
  EXPECT_GE(reinterpret_cast<char*>(b), reinterpret_cast<char*>(a + 3));
  const Workspace::Mark m = ws.mark();
  uint8_t* c = ws.bytes(100);
  ws.rewind(m);
  EXPECT_EQ(ws.bytes(100), c);
  ws.reset();
  EXPECT_EQ(ws.floats(3), a);
}

TEST(Workspace, GrowingKeepsEarlierTakesAndFreezeForbidsGrowth) {
  auto backend = make_cpu_backend();
  Workspace ws(backend.get());
  ws.reset();
  float* first = ws.floats(1000);
  for (int i = 0; i < 1000; ++i) first[i] = static_cast<float>(i);
  float* big = ws.floats(int64_t{1} << 20);  // 4 MiB: past the first block
  big[0] = 1.0f;
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(first[i], static_cast<float>(i));
  ws.freeze();
  EXPECT_TRUE(ws.frozen());
  // The same step fits the frozen workspace...
  ws.reset();
  ws.floats(1000);
  ws.floats(int64_t{1} << 20);
  // ...a larger one is refused instead of allocating.
  ws.reset();
  EXPECT_THROW(ws.floats(int64_t{1} << 24), InvalidArgument);
}

}  // namespace
}  // namespace hyserve
