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

}  // namespace hyserve::test
