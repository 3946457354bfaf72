// LoRA on the CUDA backend (issue 48): the shrink/expand op against the CPU reference, and
// a model's logits with an adapter on every target (attention projections, kv_b in low-rank
// form, dense MLP, shared and routed experts) against the CPU backend's with the same adapter.
//
// Tolerances. The op: fp32 on both sides, only the summation order differs (lane-strided
// fma sums over `in` then a butterfly, against the CPU's sequential sums): abs 1e-5, rel
// 1e-4 on outputs of O(1). The model: the golden tests' fp32 GPU path (prompts in chunks of
// 15 tokens, GEMV linears): abs 1e-3, rel 2e-4 (model_gpu_test.cpp says why).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "gpu/gpu_test_util.h"
#include "kernels/lora/cuda.h"
#include "lora_test_util.h"
#include "model/model.h"
#include "util/error.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;

struct HostPair {
  int64_t rank;
  std::vector<float> a, b;
};

// Slots: 0 rank 8, 1 none, 2 rank 64, 3 rank 1. Tokens cycle through -1, 0, 1, 2, 3.
TEST(GpuLora, LoraAddMatchesCpuLeavesOthersAndIsBatchInvariant) {
  REQUIRE_GPU();
  const int64_t in = 300, out = 77, tokens = 37;
  const std::vector<int64_t> ranks = {8, 0, 64, 1};
  std::vector<HostPair> pairs;
  uint64_t seed = 7;
  for (int64_t r : ranks) {
    pairs.push_back({r, test::random_floats(static_cast<size_t>(r * in), seed++),
                     test::random_floats(static_cast<size_t>(out * r), seed++)});
  }
  std::vector<cuda::DeviceBuffer> device_pairs;
  std::vector<LoraMatrices> host_table, device_table;
  for (size_t s = 0; s < pairs.size(); ++s) {
    const HostPair& p = pairs[s];
    const float scale = 0.5f + 0.25f * static_cast<float>(s);
    if (p.rank == 0) {
      host_table.push_back({});
      device_table.push_back({});
      continue;
    }
    host_table.push_back({p.a.data(), p.b.data(), p.rank, scale});
    device_pairs.push_back(cuda::to_device(p.a));
    const float* da = device_pairs.back().as<float>();
    device_pairs.push_back(cuda::to_device(p.b));
    device_table.push_back({da, device_pairs.back().as<float>(), p.rank, scale});
  }
  std::vector<int32_t> slots(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) slots[t] = static_cast<int32_t>(t % 5) - 1;
  const std::vector<float> x = test::random_floats(static_cast<size_t>(tokens * in), 100);
  const std::vector<float> y0 = test::random_floats(static_cast<size_t>(tokens * out), 101);
  std::vector<float> want = y0;
  cpu::lora_add({x.data(),
                 want.data(),
                 tokens,
                 in,
                 out,
                 slots.data(),
                 {host_table.data(), std::ssize(host_table)}});

  test::Stream stream;
  const cuda::DeviceBuffer dtable = cuda::to_device(device_table);
  const LoraModule module{dtable.as<LoraMatrices>(), std::ssize(device_table)};
  const auto run = [&](int64_t first, int64_t n) {
    const std::vector<float> xs(x.begin() + first * in, x.begin() + (first + n) * in);
    const std::vector<float> ys(y0.begin() + first * out, y0.begin() + (first + n) * out);
    const std::vector<int32_t> ss(slots.begin() + first, slots.begin() + first + n);
    cuda::DeviceBuffer dx = cuda::to_device(xs), dy = cuda::to_device(ys), ds = cuda::to_device(ss);
    cuda::lora_add({dx.as<float>(), dy.as<float>(), n, in, out, ds.as<int32_t>(), module},
                   stream.s);
    CUDA_CHECK(cudaStreamSynchronize(stream.s));
    return cuda::to_host<float>(dy, static_cast<size_t>(n * out));
  };
  const std::vector<float> got = run(0, tokens);
  EXPECT_TRUE(test::all_close(got, want, 1e-5f, 1e-4f));
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] >= 0 && ranks[slots[t]] > 0) continue;
    // No adapter here: the row is untouched, bit for bit.
    EXPECT_EQ(0, std::memcmp(got.data() + t * out, y0.data() + t * out, out * 4)) << "token " << t;
  }
  // A token's bits do not depend on its batch.
  for (const int64_t t : {1, 3, 33}) {
    const std::vector<float> alone = run(t, 1);
    EXPECT_EQ(0, std::memcmp(alone.data(), got.data() + t * out, out * 4)) << "token " << t;
  }
}

// A prompt (in chunks of 15) then three decode tokens, as one sequence with slot `slot`.
std::vector<float> run_sequence(const Model& model, int32_t slot) {
  const std::vector<int32_t> prompt = {3, 17, 42, 8,  99, 1, 64, 23, 7,  11, 250, 4,  5,
                                       6, 7,  30, 12, 19, 2, 77, 81, 90, 13, 14,  15, 16};
  std::vector<std::vector<int32_t>> steps;
  for (size_t b = 0; b < prompt.size(); b += 15) {
    steps.emplace_back(prompt.begin() + b, prompt.begin() + std::min(prompt.size(), b + 15));
  }
  for (int32_t tok : {5, 9, 2}) steps.push_back({tok});
  return test::run_steps_flat(model, steps, slot);
}

class GpuLoraModel : public testing::TestWithParam<const char*> {};

TEST_P(GpuLoraModel, AdapterLogitsMatchCpuAndNoAdapterIsBitwiseBase) {
  REQUIRE_GPU();
  const fs::path model_dir = fs::path(HYSERVE_SOURCE_DIR) / GetParam();
  const fs::path dir =
      fs::temp_directory_path() /
      ("hyserve_gpu_lora_" + std::to_string(::getpid()) + "_" + model_dir.filename().string());
  fs::remove_all(dir);
  const auto cpu_model = Model::load(model_dir);
  cpu_model->enable_lora(2);
  const fs::path adapter = test::write_adapter(*cpu_model, dir, 9);
  cpu_model->set_lora(1, cpu_model->read_lora(adapter, "a", 16));
  const std::vector<float> want = run_sequence(*cpu_model, 1);

  const auto gpu_plain = Model::load(model_dir, {}, make_cuda_backend(0));
  const std::vector<float> base = run_sequence(*gpu_plain, -1);
  const auto gpu_model = Model::load(model_dir, {}, make_cuda_backend(0));
  gpu_model->enable_lora(2);
  gpu_model->set_lora(1, gpu_model->read_lora(adapter, "a", 16));
  const std::vector<float> got = run_sequence(*gpu_model, 1);
  EXPECT_TRUE(test::all_close(got, want, 1e-3f, 2e-4f));
  // The adapter matters far beyond the tolerance.
  EXPECT_FALSE(test::all_close(base, want, 1e-2f, 1e-2f));
  // A sequence without an adapter on the LoRA-enabled model: the plain model's bits.
  const std::vector<float> none = run_sequence(*gpu_model, -1);
  ASSERT_EQ(none.size(), base.size());
  EXPECT_EQ(0, std::memcmp(none.data(), base.data(), base.size() * 4));
  // Emptying the slot frees its device copy; filling it again gives the same bits.
  gpu_model->set_lora(1, nullptr);
  gpu_model->set_lora(1, gpu_model->read_lora(adapter, "a", 16));
  const std::vector<float> again = run_sequence(*gpu_model, 1);
  EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * 4));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuLoraModel,
                         testing::Values("models/tiny-kimi-k3", "tests/fixtures/kimi_linear_tiny",
                                         "tests/fixtures/deepseek_v32_tiny"),
                         [](const testing::TestParamInfo<const char*>& p) {
                           return fs::path(p.param).filename().string() == "tiny-kimi-k3"
                                      ? std::string("tiny_kimi_k3")
                                      : fs::path(p.param).filename().string();
                         });

}  // namespace
}  // namespace hyserve
