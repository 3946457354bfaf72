// What the CUDA MoE tests share (moe_test.cpp, moe_lora_test.cpp): random experts on the
// host and the device, and routings made on the host so both sides run one assignment.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "gpu/test_weights.h"
#include "kernels/moe/cuda.h"

namespace hyserve::test {

struct Experts {
  std::vector<test::HostMlp> host;
  std::vector<MlpWeights> host_w;
  std::vector<test::DeviceMlp> dev;
  std::vector<MlpWeights> dev_w;
  test::HostMlp shared;
  test::DeviceMlp shared_dev;
  cuda::MoeExperts table;
};

inline Experts make_experts(int64_t n, int64_t hidden, int64_t inter, Format f, uint64_t seed) {
  Experts e;
  for (int64_t i = 0; i < n; ++i) e.host.push_back(random_mlp(hidden, inter, f, seed + 3 * i));
  for (const auto& m : e.host) {
    e.host_w.push_back(m.w);
    e.dev.push_back(upload(m));
  }
  for (const auto& d : e.dev) e.dev_w.push_back(d.w);
  e.shared = random_mlp(hidden, inter, f, seed + 3 * n);
  e.shared_dev = upload(e.shared);
  e.table = cuda::MoeExperts::upload(e.dev_w.data(), n);
  return e;
}

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Distinct random experts per token.
inline Routing random_routing(int64_t tokens, int64_t top_k, int64_t experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> w(0.1f, 1.5f);
  std::vector<int32_t> perm(experts);
  std::iota(perm.begin(), perm.end(), 0);
  Routing r;
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < top_k; ++i) {
      r.ids.push_back(perm[i]);
      r.weights.push_back(w(rng));
    }
  }
  return r;
}

// Some experts get > 16 tokens (the big tensor-core tile), others fewer (the GEMV; the
// small tile in batch-invariant mode), in one call.
inline Routing mixed_routing(int64_t tokens, int64_t top_k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> w(0.1f, 1.5f);
  Routing r;
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t slots[3] = {static_cast<int32_t>(t % 2), static_cast<int32_t>(2 + t % 5),
                              static_cast<int32_t>(t < 10 ? 7 : 2 + (t + 1) % 5)};
    for (int64_t i = 0; i < top_k; ++i) {
      r.ids.push_back(slots[i]);
      r.weights.push_back(w(rng));
    }
  }
  return r;
}

struct Shape {
  int64_t hidden, inter;
};

// Routed-expert adapters for one GPU call: the [expert][gate, up, down][slot] table on the
// device and each token's slot (-1: none).
struct RoutedLora {
  const LoraMatrices* table = nullptr;
  int64_t num_slots = 0;
  const std::vector<int32_t>* token_slots = nullptr;
};

// One cuda::moe call on fresh buffers; y in place over x when in_place.
inline std::vector<float> run_gpu(const Experts& e, const std::vector<float>& x, const Routing& r,
                                  int64_t tokens, int64_t top_k, bool shared, bool in_place,
                                  bool batch_invariant = false, const GatedActivation& act = {},
                                  cuda::MoeDecodeInput input = cuda::MoeDecodeInput::kFp32,
                                  const RoutedLora& lora = {}) {
  Stream stream;
  cuda::Blas blas(stream.s);
  const int64_t hidden = e.table.hidden();
  cuda::DeviceBuffer dx = cuda::to_device(x);
  cuda::DeviceBuffer dy(x.size() * 4 + 4);
  const cuda::DeviceBuffer ids = cuda::to_device(r.ids);
  const cuda::DeviceBuffer weights = cuda::to_device(r.weights);
  const cuda::DeviceBuffer slots =
      lora.token_slots != nullptr ? cuda::to_device(*lora.token_slots) : cuda::DeviceBuffer();
  const MlpWeights* sh = shared ? &e.shared_dev.w : nullptr;
  cuda::DeviceBuffer ws(cuda::moe_workspace_bytes(e.table, sh, tokens, top_k));
  float* y = in_place ? dx.as<float>() : dy.as<float>();
  MoeParams p{.x = dx.as<float>(),
              .num_tokens = tokens,
              .hidden = hidden,
              .num_experts = e.table.num_experts(),
              .expert_ids = ids.as<int32_t>(),
              .expert_weights = weights.as<float>(),
              .top_k = top_k,
              .shared = sh,
              .y = y,
              .act = act};
  if (lora.table != nullptr) {
    p.expert_lora_table = lora.table;
    p.lora_num_slots = lora.num_slots;
    p.lora_token_slots = slots.as<int32_t>();
  }
  cuda::moe(p, e.table, blas, ws.data(), ws.size(), stream.s, batch_invariant, input);
  CUDA_CHECK(cudaStreamSynchronize(stream.s));
  return cuda::to_host<float>(in_place ? dx : dy, static_cast<size_t>(tokens * hidden));
}

}  // namespace hyserve::test
