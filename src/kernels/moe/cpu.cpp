// CPU reference for the MoE router and experts. The router is a per-token loop
// over sorted candidates with an explicit (value desc, index asc) order. The
// experts run one at a time over their gathered tokens; per-slot outputs are
// combined afterwards in slot order, so the sum order is fixed.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/linear/params.h"
#include "kernels/moe/params.h"
#include "util/error.h"
#include "util/parallel.h"

namespace hyserve::cpu {

void check_router_params(const RouterParams& p) {
  CHECK(p.gate != nullptr, "route_experts: null gate");
  CHECK(p.num_tokens == 0 ||
            (p.x != nullptr && p.expert_ids != nullptr && p.expert_weights != nullptr),
        "route_experts: null pointer");
  CHECK(p.num_tokens >= 0, "route_experts: num_tokens ", p.num_tokens);
  CHECK(p.num_experts > 0 && p.gate->rows == p.num_experts, "route_experts: gate has ",
        p.gate->rows, " rows for ", p.num_experts, " experts");
  CHECK(p.n_group >= 1 && p.num_experts % p.n_group == 0, "route_experts: ", p.num_experts,
        " experts do not split into n_group = ", p.n_group, " groups");
  const int64_t group_size = p.num_experts / p.n_group;
  CHECK(p.n_group == 1 || group_size >= 2, "route_experts: groups of ", group_size,
        " expert(s) have no top-2 score");
  CHECK(p.topk_group >= 1 && p.topk_group <= p.n_group, "route_experts: topk_group ", p.topk_group,
        " not in [1, ", p.n_group, "]");
  CHECK(p.top_k >= 1 && p.top_k <= p.topk_group * group_size, "route_experts: top_k ", p.top_k,
        " not in [1, ", p.topk_group * group_size, "] (experts in the kept groups)");
}

void route_experts(const RouterParams& p) {
  check_router_params(p);
  const int64_t num_experts = p.num_experts;
  const int64_t group_size = num_experts / p.n_group;
  std::vector<float> logits(p.num_tokens * num_experts);  // [T, E]
  linear({.x = p.x, .w = p.gate, .y = logits.data(), .num_tokens = p.num_tokens});

  parallel_for(p.num_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> score(num_experts);      // s
    std::vector<float> selection(num_experts);  // s' = s + bias
    std::vector<float> group_score(p.n_group);
    std::vector<int64_t> groups(p.n_group);
    std::vector<int64_t> candidates;
    candidates.reserve(num_experts);
    const auto by_selection = [&](int64_t a, int64_t b) {
      return selection[a] > selection[b] || (selection[a] == selection[b] && a < b);
    };
    const auto by_group_score = [&](int64_t a, int64_t b) {
      return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
    };
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t e = 0; e < num_experts; ++e) {
        score[e] = 1.0f / (1.0f + std::exp(-logits[t * num_experts + e]));
        selection[e] = score[e] + (p.bias != nullptr ? p.bias[e] : 0.0f);
        CHECK(!std::isnan(selection[e]), "route_experts: NaN score for token ", t, ", expert ", e);
      }
      candidates.clear();
      if (p.n_group == 1) {
        for (int64_t e = 0; e < num_experts; ++e) candidates.push_back(e);
      } else {
        for (int64_t g = 0; g < p.n_group; ++g) {
          int64_t first = g * group_size;
          int64_t second = first + 1;
          if (by_selection(second, first)) std::swap(first, second);
          for (int64_t e = g * group_size + 2; e < (g + 1) * group_size; ++e) {
            if (by_selection(e, first)) {
              second = first;
              first = e;
            } else if (by_selection(e, second)) {
              second = e;
            }
          }
          group_score[g] = selection[first] + selection[second];
        }
        std::iota(groups.begin(), groups.end(), 0);
        std::partial_sort(groups.begin(), groups.begin() + p.topk_group, groups.end(),
                          by_group_score);
        std::sort(groups.begin(), groups.begin() + p.topk_group);
        for (int64_t i = 0; i < p.topk_group; ++i) {
          for (int64_t e = groups[i] * group_size; e < (groups[i] + 1) * group_size; ++e) {
            candidates.push_back(e);
          }
        }
      }
      std::partial_sort(candidates.begin(), candidates.begin() + p.top_k, candidates.end(),
                        by_selection);
      int32_t* ids = p.expert_ids + t * p.top_k;
      float* weights = p.expert_weights + t * p.top_k;
      float sum = 0.0f;
      for (int64_t i = 0; i < p.top_k; ++i) {
        ids[i] = static_cast<int32_t>(candidates[i]);
        weights[i] = score[candidates[i]];
        sum += weights[i];
      }
      for (int64_t i = 0; i < p.top_k; ++i) {
        if (p.renormalize) weights[i] /= sum + 1e-20f;
        weights[i] *= p.scaling_factor;
      }
    }
  });
}

void moe(const MoeParams& p, CpuGemm gemm) {
  CHECK(p.x != nullptr && p.experts != nullptr && p.expert_ids != nullptr &&
            p.expert_weights != nullptr && p.y != nullptr,
        "moe: null pointer");
  CHECK(p.num_tokens >= 0, "moe: num_tokens ", p.num_tokens);
  CHECK(p.hidden > 0 && p.num_experts > 0 && p.top_k > 0, "moe: hidden ", p.hidden,
        ", num_experts ", p.num_experts, ", top_k ", p.top_k);
  for (int64_t e = 0; e < p.num_experts; ++e) check_mlp_weights(p.experts[e], p.hidden);
  if (p.shared != nullptr) check_mlp_weights(*p.shared, p.hidden);
  const int64_t num_slots = p.num_tokens * p.top_k;
  // The slot's expert among p.experts, -1 when another rank has it.
  std::vector<int64_t> local(static_cast<size_t>(num_slots));
  for (int64_t s = 0; s < num_slots; ++s) {
    const int64_t e = p.expert_ids[s] - p.expert_offset;
    const bool mine = e >= 0 && e < p.num_experts;
    CHECK(mine || (p.local_experts_only && p.expert_ids[s] >= 0), "moe: expert id ",
          p.expert_ids[s], " of token ", s / p.top_k, " not in [", p.expert_offset, ", ",
          p.expert_offset + p.num_experts, ")");
    local[static_cast<size_t>(s)] = mine ? e : -1;
  }
  const int64_t hidden = p.hidden;

  // Slots (t * top_k + i) bucketed by expert, in token order within a bucket.
  std::vector<int64_t> bucket_start(p.num_experts + 1, 0);
  for (int64_t s = 0; s < num_slots; ++s) {
    if (local[s] >= 0) ++bucket_start[local[s] + 1];
  }
  std::partial_sum(bucket_start.begin(), bucket_start.end(), bucket_start.begin());
  std::vector<int64_t> slots(bucket_start.back());
  std::vector<int64_t> fill(bucket_start.begin(), bucket_start.end() - 1);
  for (int64_t s = 0; s < num_slots; ++s) {
    if (local[s] >= 0) slots[fill[local[s]]++] = s;
  }

  std::vector<float> slot_out(num_slots * hidden);  // [T * top_k, hidden]: expert(x[t])
  std::vector<float> expert_x;                      // [tokens of e, hidden]
  std::vector<float> expert_y;                      // [tokens of e, hidden]
  std::vector<int32_t> expert_slots;                // [tokens of e] their LoRA slots
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const int64_t first = bucket_start[e];
    const int64_t n = bucket_start[e + 1] - first;
    if (n == 0) continue;
    expert_x.resize(n * hidden);
    expert_y.resize(n * hidden);
    for (int64_t j = 0; j < n; ++j) {
      const float* src = p.x + (slots[first + j] / p.top_k) * hidden;
      std::copy(src, src + hidden, expert_x.begin() + j * hidden);
    }
    MlpLora lora;
    if (p.expert_lora != nullptr) {
      lora = p.expert_lora[e];
      expert_slots.resize(n);
      for (int64_t j = 0; j < n; ++j) {
        expert_slots[j] = lora.token_slots[slots[first + j] / p.top_k];
      }
      lora.token_slots = expert_slots.data();
    }
    mlp({.x = expert_x.data(),
         .w = &p.experts[e],
         .y = expert_y.data(),
         .num_tokens = n,
         .act = p.act,
         .lora = p.expert_lora != nullptr ? &lora : nullptr},
        gemm);
    for (int64_t j = 0; j < n; ++j) {
      std::copy(expert_y.begin() + j * hidden, expert_y.begin() + (j + 1) * hidden,
                slot_out.begin() + slots[first + j] * hidden);
    }
  }

  std::vector<float> shared_out;  // [T, hidden]
  if (p.shared != nullptr && p.num_tokens > 0) {
    shared_out.resize(p.num_tokens * hidden);
    mlp({.x = p.x,
         .w = p.shared,
         .y = shared_out.data(),
         .num_tokens = p.num_tokens,
         .act = p.act,
         .lora = p.shared_lora},
        gemm);
  }

  parallel_for(p.num_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* y = p.y + t * hidden;
      std::fill(y, y + hidden, 0.0f);
      for (int64_t i = 0; i < p.top_k; ++i) {
        if (local[t * p.top_k + i] < 0) continue;
        const float w = p.expert_weights[t * p.top_k + i];
        const float* out = slot_out.data() + (t * p.top_k + i) * hidden;
        for (int64_t d = 0; d < hidden; ++d) y[d] += w * out[d];
      }
      if (p.shared != nullptr) {
        for (int64_t d = 0; d < hidden; ++d) y[d] += shared_out[t * hidden + d];
      }
    }
  });
}

}  // namespace hyserve::cpu
