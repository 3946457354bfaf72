// CUDA grouped MoE experts (see cuda.h for the numerics). Steps, all on `stream`:
//   1. count    counts[e] = slots routed to e                     (atomics, integer)
//   2. scan     cursor = exclusive scan of counts; active = {expert, first position,
//               count} of the experts with tokens, in expert order, then {-1}; the
//               prefill kernels' units: their experts' tiles of 128 positions (one block)
//   3. fill     sorted_slots[cursor[e] ...] = the slots of e      (any order in a bucket)
//   4. gate/up  h[pos] = act(x W_gate^T, x W_up^T) for every sorted position pos
//               (p.act: silu(gate) * up or SiTU, gated_activation in kernels/mlp/params.h)
//   5. down     slot_out[slot] = h[pos] W_down^T
//   6. shared   shared_out = cuda::mlp(x) with p.act when there is a shared expert
//   7. combine  y[t] = sum_i w_i * slot_out[t * top_k + i] (+ shared_out[t])
// Steps 4 and 5 launch kernels over (active expert, row block) for each kind of expert by
// token count (Path); a block whose expert is of another kind returns at once:
//   1..16 tokens  the decode kernels (moe_decode.cuh; BF16, FP8, MXFP4 experts), whose
//                 gate/up writes h as split bf16 terms in down's layout; the activations x
//                 are split once per call (step 3b)
//   1..15 tokens  a memory-bound GEMV kernel (the other formats, or misaligned rows)
//   > 16 tokens   MoeExperts::prefill_kernel(), over their own list of 128-position
//                 tiles (scan_kernel's prefill units): CUTLASS's grouped GEMM (grouped_gemm.h,
//                 BF16: rows gathered as bf16, gate and up in one launch into h's region and
//                 the `grouped_out` region, act to bf16 rows, down, scatter to slot_out), or
//                 the prefill kernels (moe_prefill.cuh; hidden and inter multiples of 64: x
//                 rounded to bf16 once per call, gate/up writes h as bf16 in h's region)
//   16, > 16      the other experts, and every expert in batch-invariant mode: the small
//                 and the big tile of mma_tile.cuh (16 only in batch-invariant mode or
//                 without the decode kernels)
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <vector>

#include "kernels/linear/cuda/gemv.cuh"
#include "kernels/linear/cuda/mma_tile.cuh"
#include "kernels/mlp/cuda.h"
#include "kernels/moe/cuda.h"
#include "kernels/moe/cuda/grouped_gemm.h"
#include "kernels/moe/cuda/moe_common.cuh"
#include "kernels/moe/cuda/moe_decode.cuh"
#include "kernels/moe/cuda/moe_lora.cuh"
#include "kernels/moe/cuda/moe_prefill.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

using moe_internal::assign;
using moe_internal::Assignment;
using moe_internal::Buckets;
using moe_internal::ExpertLora;
using moe_internal::ExpertPtrs;
using moe_internal::lora_gate_up;
static_assert(sizeof(ExpertPtrs) == 6 * sizeof(void*),
              "grouped_gemm.h reads the table as 6 pointers");
using moe_internal::Geometry;
using moe_internal::Path;
using moe_internal::with_expert;
namespace decode = moe_internal::decode;
namespace prefill = moe_internal::prefill;

constexpr size_t kAlign = 256;
constexpr int kSmallWarps = 8;  // memory-bound kernels: one weight row per warp
using tile::kBN;
using tile::kLdC;
using tile::kMmaThreads;
using tile::MmaSmem;

constexpr int kScanThreads = 1024;
// CUTLASS's grouped GEMM runs BF16 experts only when picked (set_prefill_kernel) until it
// is measured against the prefill kernels on a GPU (BENCHMARKS.md).
constexpr bool kGroupedByDefault = false;
static_assert(kMoeMmaMinTokens <= kGemvMaxTokens + 1, "small path handles up to 15 tokens");

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Workspace regions, each kAlign-aligned.
struct Layout {
  size_t counts, cursor, active, sorted_slots, h, slot_out, x_split, h_split, units, unit_counts,
      partials, arrivals, x_bf16, prefill_units, prefill_count, grouped_rows, grouped_out,
      grouped_ws, shared_out, shared_ws, lora_u, total;
  size_t grouped_ws_bytes = 0;
  size_t arrivals_bytes = 0;
  size_t lora_u_bytes = 0;

  // split: the formats of the decode kernels' split activation rows (gate's for x, down's
  // for h; the same), or null when the decode kernels do not run. prefill: what runs the
  // experts past them (the prefill kernels' h, bf16, lies in h's region; the grouped GEMM's
  // gate output, fp32, too).
  Layout(int64_t num_experts, int64_t inter, int64_t hidden, int64_t max_tokens, int64_t top_k,
         const MlpWeights* shared, const WFmt* split, MoePrefillKernel prefill_kernel) {
    const bool prefill = prefill_kernel != MoePrefillKernel::kTiles;
    const bool grouped = prefill_kernel == MoePrefillKernel::kGrouped;
    const auto e = static_cast<size_t>(num_experts);
    const auto s = static_cast<size_t>(max_tokens * top_k);
    size_t at = 0;
    const auto take = [&](size_t bytes) {
      const size_t here = at;
      at += align_up(bytes);
      return here;
    };
    counts = take(e * 4);
    cursor = take(e * 4);
    active = take(e * sizeof(int4));
    sorted_slots = take(s * 4);
    h = take(s * static_cast<size_t>(inter) * 4);
    slot_out = take(s * static_cast<size_t>(hidden) * 4);
    const size_t terms = split != nullptr ? decode::kMaxTerms : 0;
    x_split =
        take(terms * static_cast<size_t>(max_tokens) *
             static_cast<size_t>(split != nullptr ? decode::split_cols(*split, hidden) : 0) * 2);
    h_split =
        take(terms * s *
             static_cast<size_t>(split != nullptr ? decode::split_cols(*split, inter) : 0) * 2);
    units = take(split != nullptr ? decode::kClasses * e * sizeof(decode::DecodeUnit) : 0);
    unit_counts = take(split != nullptr ? decode::kClasses * 4 : 0);
    // Class 0's k split: at most kMaxItems work items of units of a bounded count.
    const auto tiles =
        static_cast<size_t>(std::max((inter + decode::kGateUpRows - 1) / decode::kGateUpRows,
                                     (hidden + decode::kDownRows - 1) / decode::kDownRows));
    const size_t units_bound =
        split != nullptr ? std::min(std::min(e, s) * tiles, size_t{decode::kMaxItems}) : 0;
    partials = take(split != nullptr
                        ? std::min(units_bound * decode::kMaxParts, size_t{decode::kMaxItems}) *
                              decode::kPartialBytes
                        : 0);
    arrivals_bytes = units_bound * 4;
    arrivals = take(arrivals_bytes);
    x_bf16 = take(prefill && !grouped ? static_cast<size_t>(max_tokens * hidden) * 2 : 0);
    // At most one partial tile per expert with tokens.
    prefill_units = take(prefill ? (std::min(e, s) + s / prefill::kBM + 1) * sizeof(int4) : 0);
    prefill_count = take(prefill ? 4 : 0);
    const auto pitch = static_cast<size_t>(std::max(hidden, inter));
    grouped_rows = take(grouped ? s * pitch * 2 : 0);
    grouped_out = take(grouped ? s * pitch * 4 : 0);
    grouped_ws_bytes = grouped ? moe_internal::expert_gemm_workspace_bytes(num_experts, 2) : 0;
    grouped_ws = take(grouped_ws_bytes);
    shared_out = take(shared != nullptr ? static_cast<size_t>(max_tokens * hidden) * 4 : 0);
    shared_ws = take(shared != nullptr ? mlp_workspace_bytes(*shared, max_tokens) : 0);
    // Routed experts' LoRA shrinks ([positions][2][kMaxLoraRank]): in slot_out, which the down
    // kernels write only after the gate/up kernels read them, when its rows are wide enough.
    lora_u_bytes = hidden >= 2 * kMaxLoraRank ? 0 : s * 2 * kMaxLoraRank * 4;
    lora_u = take(lora_u_bytes);
    total = at;
  }
};

__global__ void count_kernel(const int32_t* __restrict__ ids, int64_t num_slots,
                             int64_t num_experts, int32_t offset, int32_t* __restrict__ counts) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < num_slots;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = ids[s] - offset;
    if (e >= 0 && e < num_experts) atomicAdd(counts + e, 1);
  }
}

__global__ void __launch_bounds__(kScanThreads)
    scan_kernel(const int32_t* __restrict__ counts, int64_t num_experts, int32_t* cursor,
                int4* active, int32_t prefill_min, int4* __restrict__ prefill_units,
                int32_t* __restrict__ prefill_count) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int32_t running_offset = 0;
  int32_t running_active = 0;
  int32_t running_units = 0;
  for (int64_t base = 0; base < num_experts; base += kScanThreads) {
    const int64_t e = base + threadIdx.x;
    const int32_t c = e < num_experts ? counts[e] : 0;
    int32_t offset, total;
    Scan(tmp).ExclusiveSum(c, offset, total);
    __syncthreads();
    int32_t rank, num;
    Scan(tmp).ExclusiveSum(c > 0 ? 1 : 0, rank, num);
    __syncthreads();
    // The prefill kernels' units: an expert's tiles of kBM positions, adjacent.
    const int32_t tiles = c >= prefill_min ? (c + prefill::kBM - 1) / prefill::kBM : 0;
    int32_t unit, units;
    Scan(tmp).ExclusiveSum(tiles, unit, units);
    __syncthreads();
    if (e < num_experts) {
      cursor[e] = running_offset + offset;
      if (c > 0) {
        active[running_active + rank] =
            make_int4(static_cast<int32_t>(e), running_offset + offset, c, 0);
      }
      for (int32_t j = 0; j < tiles; ++j) {
        prefill_units[running_units + unit + j] =
            make_int4(static_cast<int32_t>(e), running_offset + offset + j * prefill::kBM,
                      min(prefill::kBM, c - j * prefill::kBM), 0);
      }
    }
    running_offset += total;
    running_active += num;
    running_units += units;
  }
  if (threadIdx.x == 0 && prefill_count != nullptr) *prefill_count = running_units;
  for (int64_t i = running_active + threadIdx.x; i < num_experts; i += kScanThreads) {
    active[i] = make_int4(-1, 0, 0, 0);
  }
}

__global__ void fill_kernel(const int32_t* __restrict__ ids, int64_t num_slots, int64_t num_experts,
                            int32_t offset, int32_t* __restrict__ cursor,
                            int32_t* __restrict__ sorted_slots) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < num_slots;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = ids[s] - offset;
    if (e >= 0 && e < num_experts) sorted_slots[atomicAdd(cursor + e, 1)] = static_cast<int32_t>(s);
  }
}

// Step 4, few tokens: warp w of block (a, rb) computes rows (rb * kSmallWarps + w) *
// kGemvRows .. + kGemvRows of gate and up for every token of the expert.
template <WFmt F, bool kVec>
__global__ void __launch_bounds__(kSmallWarps * 32)
    gate_up_small_kernel(Geometry g, const ExpertPtrs* __restrict__ table, Buckets b,
                         const float* __restrict__ x, float* __restrict__ h, ExpertLora lora) {
  const Assignment a = assign<Path::kGemv>(g, b, blockIdx.x);
  if (a.expert < 0) return;
  __shared__ const float* xs[kGemvMaxTokens];
  if (threadIdx.x < a.count) {
    xs[threadIdx.x] = x + (b.sorted_slots[a.begin + threadIdx.x] / g.top_k) * g.hidden;
  }
  __syncthreads();
  const int64_t r0 =
      (static_cast<int64_t>(blockIdx.y) * kSmallWarps + threadIdx.x / 32) * kGemvRows;
  if (r0 >= g.inter) return;
  const int num_rows = static_cast<int>(g.inter - r0 < kGemvRows ? g.inter - r0 : kGemvRows);
  const int lane = threadIdx.x % 32;
  const ExpertPtrs& e = table[a.expert];
  float acc_gate[kGemvRows][kGemvMaxTokens] = {};
  float acc_up[kGemvRows][kGemvMaxTokens] = {};
  lane_row_dots<F, kVec>(with_expert(g.gate, e, 0), r0, num_rows, xs, a.count, lane, acc_gate);
  lane_row_dots<F, kVec>(with_expert(g.up, e, 1), r0, num_rows, xs, a.count, lane, acc_up);
  warp_sum(acc_gate, num_rows, a.count);
  warp_sum(acc_up, num_rows, a.count);
#pragma unroll
  for (int q = 0; q < kGemvRows; ++q) {
#pragma unroll
    for (int j = 0; j < kGemvMaxTokens; ++j) {
      if (q < num_rows && j < a.count && lane == j) {
        float gate = acc_gate[q][j], up = acc_up[q][j];
        const int32_t pos = a.begin + j;
        lora_gate_up(lora, a.expert, pos, b.sorted_slots[pos], r0 + q, gate, up);
        h[pos * g.inter + r0 + q] = gated_activation(gate, up, g.act);
      }
    }
  }
}

// Step 5, few tokens: rows r0 .. r0 + kGemvRows of down for every token of the expert.
template <WFmt F, bool kVec>
__global__ void __launch_bounds__(kSmallWarps * 32)
    down_small_kernel(Geometry g, const ExpertPtrs* __restrict__ table, Buckets b,
                      const float* __restrict__ h, float* __restrict__ slot_out) {
  const Assignment a = assign<Path::kGemv>(g, b, blockIdx.x);
  if (a.expert < 0) return;
  __shared__ const float* xs[kGemvMaxTokens];
  if (threadIdx.x < a.count) xs[threadIdx.x] = h + (a.begin + threadIdx.x) * g.inter;
  __syncthreads();
  const int64_t r0 =
      (static_cast<int64_t>(blockIdx.y) * kSmallWarps + threadIdx.x / 32) * kGemvRows;
  if (r0 >= g.hidden) return;
  const int num_rows = static_cast<int>(g.hidden - r0 < kGemvRows ? g.hidden - r0 : kGemvRows);
  const int lane = threadIdx.x % 32;
  float acc[kGemvRows][kGemvMaxTokens] = {};
  lane_row_dots<F, kVec>(with_expert(g.down, table[a.expert], 2), r0, num_rows, xs, a.count, lane,
                         acc);
  warp_sum(acc, num_rows, a.count);
#pragma unroll
  for (int q = 0; q < kGemvRows; ++q) {
#pragma unroll
    for (int j = 0; j < kGemvMaxTokens; ++j) {
      if (q < num_rows && j < a.count && lane == j) {
        slot_out[b.sorted_slots[a.begin + j] * g.hidden + r0 + q] = acc[q][j];
      }
    }
  }
}

// Step 4, many tokens: block (a, nb) computes h[:, nb * kBN .. + kBN] for all tokens
// of the expert, kBM (T's token count) at a time.
template <class T, WFmt F, bool kVec>
__global__ void __launch_bounds__(kMmaThreads)
    gate_up_mma_kernel(Geometry g, const ExpertPtrs* __restrict__ table, Buckets b,
                       const float* __restrict__ x, float* __restrict__ h, ExpertLora lora) {
  constexpr int kBM = T::kTokens;
  const Assignment a = assign < T::kTokens == tile::SmallTile::kTokens
                           ? Path::kSmallTile
                           : Path::kBigTile > (g, b, blockIdx.x);
  if (a.expert < 0) return;
  __shared__ MmaSmem<T, 2> s;
  const ExpertPtrs& e = table[a.expert];
  const WRef ws[2] = {with_expert(g.gate, e, 0), with_expert(g.up, e, 1)};
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  for (int m0 = 0; m0 < a.count; m0 += kBM) {
    if (threadIdx.x < kBM) {
      const int m = m0 + threadIdx.x;
      s.rows[threadIdx.x] =
          m < a.count ? x + (b.sorted_slots[a.begin + m] / g.top_k) * g.hidden : nullptr;
    }
    __syncthreads();
    tile::mma_tile<T, F, kVec, 2>(ws, n0, s);
    for (int i = threadIdx.x; i < kBM * kBN; i += kMmaThreads) {
      const int m = i / kBN;
      const int n = i % kBN;
      if (m0 + m < a.count && n0 + n < g.inter) {
        float gate = s.c[0][m * kLdC + n], up = s.c[1][m * kLdC + n];
        const int32_t pos = a.begin + m0 + m;
        lora_gate_up(lora, a.expert, pos, b.sorted_slots[pos], n0 + n, gate, up);
        h[static_cast<int64_t>(pos) * g.inter + n0 + n] = gated_activation(gate, up, g.act);
      }
    }
    __syncthreads();
  }
}

// Step 5, many tokens: slot_out[slot, nb * kBN .. + kBN] for all tokens of the expert.
template <class T, WFmt F, bool kVec>
__global__ void __launch_bounds__(kMmaThreads)
    down_mma_kernel(Geometry g, const ExpertPtrs* __restrict__ table, Buckets b,
                    const float* __restrict__ h, float* __restrict__ slot_out) {
  constexpr int kBM = T::kTokens;
  const Assignment a = assign < T::kTokens == tile::SmallTile::kTokens
                           ? Path::kSmallTile
                           : Path::kBigTile > (g, b, blockIdx.x);
  if (a.expert < 0) return;
  __shared__ MmaSmem<T, 1> s;
  const WRef ws[1] = {with_expert(g.down, table[a.expert], 2)};
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  for (int m0 = 0; m0 < a.count; m0 += kBM) {
    if (threadIdx.x < kBM) {
      const int m = m0 + threadIdx.x;
      s.rows[threadIdx.x] = m < a.count ? h + (a.begin + m) * g.inter : nullptr;
    }
    __syncthreads();
    tile::mma_tile<T, F, kVec, 1>(ws, n0, s);
    for (int i = threadIdx.x; i < kBM * kBN; i += kMmaThreads) {
      const int m = i / kBN;
      const int n = i % kBN;
      if (m0 + m < a.count && n0 + n < g.hidden) {
        slot_out[b.sorted_slots[a.begin + m0 + m] * g.hidden + n0 + n] = s.c[0][m * kLdC + n];
      }
    }
    __syncthreads();
  }
}

// Step 7: y[t] = sum_i w_i * slot_out[t, i] (slot order, separately rounded as on the
// CPU) + shared_out[t].
__global__ void combine_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights,
                               const float* __restrict__ slot_out,
                               const float* __restrict__ shared_out, int64_t top_k,
                               int64_t num_experts, int32_t offset, int64_t hidden,
                               float* __restrict__ y) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < hidden; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < top_k; ++i) {
      const int64_t slot = t * top_k + i;
      const int32_t e = ids[slot] - offset;
      if (e >= 0 && e < num_experts) {
        acc = __fadd_rn(acc, __fmul_rn(weights[slot], slot_out[slot * hidden + d]));
      }
    }
    if (shared_out != nullptr) acc = __fadd_rn(acc, shared_out[t * hidden + d]);
    y[t * hidden + d] = acc;
  }
}

bool same_layout(const Weight& a, const Weight& b) {
  return a.format == b.format && a.dtype == b.dtype && a.scales_dtype == b.scales_dtype &&
         a.rows == b.rows && a.cols == b.cols;
}

bool chunk_aligned(const Weight& w) {
  const WRef r = make_wref(w);
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         row_bytes(weight_wfmt(w), r.cols) % 16 == 0 && r.cols % 4 == 0;
}

// MXFP4 scale rows that are whole 4-byte words (the decode kernels copy them as such).
bool mxfp4_scale_words(const Weight& w) {
  return weight_wfmt(w) == WFmt::kMxfp4 && reinterpret_cast<uintptr_t>(w.scales) % 4 == 0 &&
         (w.cols / Weight::kMxfp4BlockSize) % 4 == 0;
}

// Blocks of `kernel` that fit on the device at once (its SMs times the blocks per SM).
template <typename Kernel>
int64_t persistent_blocks(Kernel kernel, int threads, size_t smem = 0) {
  int device = 0, num_sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return static_cast<int64_t>(std::max(per_sm, 1)) * num_sms;
}

int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65536));
}

}  // namespace

MoeExperts MoeExperts::upload(const MlpWeights* experts, int64_t num_experts) {
  CHECK(experts != nullptr && num_experts > 0, "MoeExperts::upload: ", num_experts, " experts");
  CHECK(num_experts <= INT32_MAX, "MoeExperts::upload: too many experts");
  const MlpWeights& first = experts[0];
  cpu::check_mlp_weights(first, first.down.rows);
  CHECK(weight_wfmt(first.gate) == weight_wfmt(first.up) &&
            first.gate.scales_dtype == first.up.scales_dtype,
        "MoeExperts::upload: gate and up must share one format");
  MoeExperts out;
  out.layout_ = first;
  out.num_experts_ = num_experts;
  out.gate_up_aligned_ = true;
  out.down_aligned_ = true;
  out.scale_words_[0] = out.scale_words_[1] = true;
  std::vector<ExpertPtrs> table(static_cast<size_t>(num_experts));
  for (int64_t e = 0; e < num_experts; ++e) {
    const MlpWeights& w = experts[e];
    CHECK(same_layout(w.gate, first.gate) && same_layout(w.up, first.up) &&
              same_layout(w.down, first.down),
          "MoeExperts::upload: expert ", e, " differs from expert 0 in shape or format");
    const Weight* m[3] = {&w.gate, &w.up, &w.down};
    for (int i = 0; i < 3; ++i) {
      CHECK(m[i]->data != nullptr, "MoeExperts::upload: expert ", e, " has no data");
      table[e].data[i] = m[i]->data;
      table[e].scales[i] = m[i]->scales;
    }
    out.gate_up_aligned_ = out.gate_up_aligned_ && chunk_aligned(w.gate) && chunk_aligned(w.up);
    out.scale_words_[0] =
        out.scale_words_[0] && mxfp4_scale_words(w.gate) && mxfp4_scale_words(w.up);
    out.scale_words_[1] = out.scale_words_[1] && mxfp4_scale_words(w.down);
    out.down_aligned_ = out.down_aligned_ && chunk_aligned(w.down);
  }
  out.table_ = to_device(table);
  const WFmt f = weight_wfmt(first.gate);
  out.decode_kernels_ = decode::supported(f) && f == weight_wfmt(first.down) &&
                        out.gate_up_aligned_ && out.down_aligned_;
  out.prefill_kernels_ = out.decode_kernels_ && prefill::supported(f) &&
                         out.hidden() % prefill::kBK == 0 && out.inter() % prefill::kBK == 0;
  out.grouped_gemm_ = out.decode_kernels_ && f == WFmt::kBF16 &&
                      moe_internal::expert_gemm_supported(out.inter(), out.hidden()) &&
                      moe_internal::expert_gemm_supported(out.hidden(), out.inter());
  out.prefill_kernel_ = kGroupedByDefault && out.grouped_gemm_ ? MoePrefillKernel::kGrouped
                        : out.prefill_kernels_                 ? MoePrefillKernel::kWarpgroup
                                                               : MoePrefillKernel::kTiles;
  return out;
}

void MoeExperts::set_prefill_kernel(MoePrefillKernel k) {
  CHECK(k != MoePrefillKernel::kGrouped || grouped_gemm_,
        "MoeExperts: the grouped GEMM takes BF16 experts with hidden and inter multiples of 8");
  CHECK(k != MoePrefillKernel::kWarpgroup || prefill_kernels_,
        "MoeExperts: the prefill kernels take BF16, FP8 and MXFP4 experts with hidden and inter "
        "multiples of 64");
  prefill_kernel_ = k;
}

size_t moe_workspace_bytes(const MoeExperts& experts, const MlpWeights* shared, int64_t max_tokens,
                           int64_t top_k) {
  CHECK(max_tokens >= 0 && top_k > 0, "moe_workspace_bytes: max_tokens ", max_tokens, ", top_k ",
        top_k);
  CHECK(experts.num_experts() > 0, "moe_workspace_bytes: experts not uploaded");
  const WFmt split = weight_wfmt(experts.layout().gate);
  return Layout(experts.num_experts(), experts.inter(), experts.hidden(), max_tokens, top_k, shared,
                experts.decode_kernels() ? &split : nullptr, experts.prefill_kernel())
      .total;
}

void moe(const MoeParams& p, const MoeExperts& experts, const Blas& blas, void* workspace,
         size_t workspace_bytes, cudaStream_t stream, bool batch_invariant,
         MoeDecodeInput decode_input) {
  CHECK(p.x != nullptr && p.expert_ids != nullptr && p.expert_weights != nullptr && p.y != nullptr,
        "moe: null pointer");
  CHECK(p.num_tokens >= 0, "moe: num_tokens ", p.num_tokens);
  CHECK(p.hidden > 0 && p.num_experts > 0 && p.top_k > 0, "moe: hidden ", p.hidden,
        ", num_experts ", p.num_experts, ", top_k ", p.top_k);
  CHECK(experts.num_experts() == p.num_experts && experts.hidden() == p.hidden,
        "moe: ", experts.num_experts(), " uploaded experts of hidden size ", experts.hidden(),
        " for ", p.num_experts, " experts of hidden size ", p.hidden);
  if (p.shared != nullptr) cpu::check_mlp_weights(*p.shared, p.hidden);
  cpu::check_gated_activation(p.act);
  CHECK(blas.stream() == stream, "moe: the Blas handle is bound to another stream");
  if (p.num_tokens == 0) return;
  const int64_t num_slots = p.num_tokens * p.top_k;
  CHECK(num_slots <= INT32_MAX, "moe: ", num_slots, " slots are too many");
  const MlpWeights& l = experts.layout();
  const WFmt split_fmt = weight_wfmt(l.gate);
  const Layout lay(p.num_experts, experts.inter(), p.hidden, p.num_tokens, p.top_k, p.shared,
                   experts.decode_kernels() ? &split_fmt : nullptr, experts.prefill_kernel());
  CHECK(workspace != nullptr && workspace_bytes >= lay.total, "moe: workspace of ", workspace_bytes,
        " bytes, ", p.num_tokens, " tokens need ", lay.total);
  auto* base = static_cast<char*>(workspace);
  const auto at = [&](size_t offset) { return base + offset; };
  auto* counts = reinterpret_cast<int32_t*>(at(lay.counts));
  auto* cursor = reinterpret_cast<int32_t*>(at(lay.cursor));
  auto* active = reinterpret_cast<int4*>(at(lay.active));
  auto* sorted_slots = reinterpret_cast<int32_t*>(at(lay.sorted_slots));
  auto* h = reinterpret_cast<float*>(at(lay.h));
  auto* slot_out = reinterpret_cast<float*>(at(lay.slot_out));
  float* shared_out = p.shared != nullptr ? reinterpret_cast<float*>(at(lay.shared_out)) : nullptr;

  CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(p.num_experts) * 4, stream));
  CHECK(p.expert_offset >= 0 && p.expert_offset <= INT32_MAX, "moe: expert offset ",
        p.expert_offset);
  const auto offset = static_cast<int32_t>(p.expert_offset);
  count_kernel<<<grid_for(num_slots, 256), 256, 0, stream>>>(p.expert_ids, num_slots, p.num_experts,
                                                             offset, counts);
  CUDA_CHECK_LAUNCH();
  // Routed experts' adapters (moe_lora.cuh) ride on the fp32 paths: the GEMV kernel and the
  // tiles (the decode and prefill kernels keep h in bf16 forms).
  const bool lora = p.expert_lora_table != nullptr;
  CHECK(!lora || (p.lora_token_slots != nullptr && p.lora_num_slots > 0 &&
                  p.lora_num_slots <= INT32_MAX),
        "moe: routed experts' LoRA table without token slots (", p.lora_num_slots, " slots)");
  const bool decode_runs = experts.decode_kernels() && !batch_invariant && !lora;
  // Experts with more than the decode kernels' tokens run the prefill kernels when the
  // experts allow them (outside batch-invariant mode, which keeps mma_tile.cuh's tiles).
  const bool prefill_runs = decode_runs && experts.prefill_kernel() != MoePrefillKernel::kTiles &&
                            num_slots > kMoeDecodeMaxTokens;
  auto* prefill_units = reinterpret_cast<int4*>(at(lay.prefill_units));
  auto* prefill_count = reinterpret_cast<int32_t*>(at(lay.prefill_count));
  scan_kernel<<<1, kScanThreads, 0, stream>>>(
      counts, p.num_experts, cursor, active,
      prefill_runs ? static_cast<int32_t>(kMoeDecodeMaxTokens + 1) : INT32_MAX,
      prefill_runs ? prefill_units : nullptr, prefill_runs ? prefill_count : nullptr);
  CUDA_CHECK_LAUNCH();
  fill_kernel<<<grid_for(num_slots, 256), 256, 0, stream>>>(p.expert_ids, num_slots, p.num_experts,
                                                            offset, cursor, sorted_slots);
  CUDA_CHECK_LAUNCH();

  Geometry g;
  g.gate = make_wref(l.gate);
  g.up = make_wref(l.up);
  g.down = make_wref(l.down);
  g.hidden = p.hidden;
  g.inter = experts.inter();
  g.top_k = p.top_k;
  g.mma_min_tokens = batch_invariant ? 1 : static_cast<int32_t>(kMoeMmaMinTokens);
  g.decode_max_tokens = decode_runs ? static_cast<int32_t>(kMoeDecodeMaxTokens) : 0;
  g.act = p.act;
  const Buckets b{active, sorted_slots};
  ExpertLora lora_args;
  if (lora) {
    lora_args = {.table = p.expert_lora_table,
                 .num_slots = static_cast<int32_t>(p.lora_num_slots),
                 .token_slots = p.lora_token_slots,
                 .top_k = p.top_k,
                 .u = lay.lora_u_bytes > 0 ? reinterpret_cast<float*>(at(lay.lora_u)) : slot_out};
  }
  const auto* table = static_cast<const ExpertPtrs*>(experts.device_table());
  const auto max_active = static_cast<unsigned>(std::min(p.num_experts, num_slots));
  const auto blocks = [&](int64_t rows, int64_t per_block) {
    return dim3(max_active, static_cast<unsigned>((rows + per_block - 1) / per_block));
  };
  const bool x_aligned = reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  // The GEMV kernels' 16-byte path (gemv.cuh); the tiles load 16-byte chunks whenever aligned.
  const bool gate_up_gemv_vec = experts.gate_up_aligned() && x_aligned &&
                                gemv_row_fills_warp(weight_wfmt(l.gate), l.gate.cols);
  const bool down_gemv_vec =
      experts.down_aligned() && gemv_row_fills_warp(weight_wfmt(l.down), l.down.cols);

  // No expert has more than num_slots tokens: a path no expert can take is not launched
  // (when every expert runs the tiles, the GEMV kernels are not launched either; when the
  // decode kernels take up to 16 tokens, neither are the GEMV kernels nor the small tile).
  const int32_t tile_min = std::max(g.mma_min_tokens, g.decode_max_tokens + 1);
  const bool gemv_may_run = g.decode_max_tokens + 1 < g.mma_min_tokens;
  const bool small_tile_may_run = tile_min <= tile::SmallTile::kTokens && num_slots >= tile_min;
  const bool big_tile_may_run = !prefill_runs && num_slots > tile::SmallTile::kTokens;
  if (decode_runs) {
    const int terms = decode_input == MoeDecodeInput::kFp32 ? 3 : 1;
    auto* lists = reinterpret_cast<decode::DecodeUnit*>(at(lay.units));
    auto* class_counts = reinterpret_cast<int32_t*>(at(lay.unit_counts));
    decode::units_kernel<<<1, 1024, 0, stream>>>(active, table, p.num_experts, g.decode_max_tokens,
                                                 terms, lists, class_counts);
    CUDA_CHECK_LAUNCH();
    decode::DecodeArgs args{.g = g,
                            .units = nullptr,
                            .count = nullptr,
                            .sorted_slots = sorted_slots,
                            .in = {reinterpret_cast<uint16_t*>(at(lay.x_split)),
                                   p.num_tokens * decode::split_cols(split_fmt, p.hidden),
                                   decode::split_cols(split_fmt, p.hidden)},
                            .h = {reinterpret_cast<uint16_t*>(at(lay.h_split)),
                                  num_slots * decode::split_cols(split_fmt, g.inter),
                                  decode::split_cols(split_fmt, g.inter)},
                            .slot_out = slot_out,
                            .scale_words = false,
                            .parts = 1,
                            .partials = reinterpret_cast<float*>(at(lay.partials)),
                            .arrivals = reinterpret_cast<int32_t*>(at(lay.arrivals))};
    bool arrivals_zeroed = false;
    const decode::SplitRows h_rows = args.h;
    dispatch_format(split_fmt, [&]<WFmt F>() {
      if constexpr (decode::supported(F)) {
        const auto run = [&]<int kTerms>() {
          decode::split_kernel<F, kTerms><<<grid_for(args.in.plane, 256), 256, 0, stream>>>(
              p.x, p.num_tokens, p.hidden, args.in.data);
          CUDA_CHECK_LAUNCH();
          // Each class whose fewest tokens fit this call; gate/up of every class, then down.
          const auto each_class = [&]<bool kGateUp>() {
            const int64_t tiles =
                kGateUp ? (h_rows.cols + decode::kGateUpRows - 1) / decode::kGateUpRows
                        : (g.hidden + decode::kDownRows - 1) / decode::kDownRows;
            const auto one = [&]<int kC>() {
              constexpr int kNT = 1 << kC;
              if constexpr (decode::class_min_tokens(kC, kTerms) <= kMoeDecodeMaxTokens) {
                if (decode::class_min_tokens(kC, kTerms) >
                    std::min<int64_t>(num_slots, kMoeDecodeMaxTokens))
                  return;
                args.units = lists + kC * p.num_experts;
                args.count = class_counts + kC;
                if (!kGateUp) args.in = h_rows;
                args.scale_words = experts.scale_words(kGateUp ? 0 : 1);
                const auto kernel = decode::experts_kernel<F, kTerms, kNT, kGateUp>;
                constexpr size_t kSmem = decode::smem_bytes();
                CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(kSmem)));
                const int64_t resident = persistent_blocks(kernel, decode::kThreads, kSmem);
                // Class 0 (1 or 2 tokens per expert, the bulk of a decode step) splits k when
                // its units leave warps idle or a ragged last round (decode::DecodeArgs).
                args.parts = 1;
                if (kC == 0) {
                  const int64_t stages =
                      decode::num_stages(split_fmt, kGateUp ? p.hidden : g.inter);
                  args.parts = static_cast<int32_t>(decode::choose_parts(
                      static_cast<int64_t>(max_active) * tiles, resident * decode::kWarps, stages));
                  if (args.parts > 1 && !arrivals_zeroed) {
                    CUDA_CHECK(cudaMemsetAsync(args.arrivals, 0, lay.arrivals_bytes, stream));
                    arrivals_zeroed = true;
                  }
                }
                const int64_t items = static_cast<int64_t>(max_active) * tiles * args.parts;
                const int64_t blocks =
                    std::min<int64_t>(resident, (items + decode::kWarps - 1) / decode::kWarps);
                kernel<<<static_cast<unsigned>(blocks), decode::kThreads, kSmem, stream>>>(args);
                CUDA_CHECK_LAUNCH();
              }
            };
            one.template operator()<0>();
            one.template operator()<1>();
            one.template operator()<2>();
            one.template operator()<3>();
          };
          each_class.template operator()<true>();
          each_class.template operator()<false>();
        };
        if (terms == 3) {
          run.template operator()<3>();
        } else {
          run.template operator()<1>();
        }
      }
    });
  }
  // Units: at most one partial tile per expert with tokens.
  const int64_t max_units = static_cast<int64_t>(max_active) + num_slots / prefill::kBM + 1;
  if (prefill_runs && experts.prefill_kernel() == MoePrefillKernel::kGrouped) {
    moe_internal::grouped_experts_bf16({.active = active,
                                        .units = prefill_units,
                                        .unit_count = prefill_count,
                                        .max_units = max_units,
                                        .sorted_slots = sorted_slots,
                                        .table = table,
                                        .num_experts = static_cast<int32_t>(p.num_experts),
                                        .min_rows = static_cast<int32_t>(kMoeDecodeMaxTokens + 1),
                                        .x = p.x,
                                        .top_k = p.top_k,
                                        .hidden = p.hidden,
                                        .inter = g.inter,
                                        .act = p.act,
                                        .rows = reinterpret_cast<uint16_t*>(at(lay.grouped_rows)),
                                        .gate = h,
                                        .out = reinterpret_cast<float*>(at(lay.grouped_out)),
                                        .gemm_workspace = at(lay.grouped_ws),
                                        .gemm_workspace_bytes = lay.grouped_ws_bytes,
                                        .slot_out = slot_out},
                                       stream);
  } else if (prefill_runs) {
    auto* x_bf16 = reinterpret_cast<uint16_t*>(at(lay.x_bf16));
    prefill::to_bf16_kernel<<<grid_for(p.num_tokens * p.hidden, 256), 256, 0, stream>>>(
        p.x, p.num_tokens * p.hidden, x_bf16);
    CUDA_CHECK_LAUNCH();
    // h of these experts as bf16 in h's region (no fp32 h is written when the decode
    // kernels run).
    prefill::PrefillArgs args{.g = g,
                              .table = table,
                              .units = prefill_units,
                              .count = prefill_count,
                              .sorted_slots = sorted_slots,
                              .a = x_bf16,
                              .h = reinterpret_cast<uint16_t*>(h),
                              .slot_out = slot_out};
    dispatch_format(split_fmt, [&]<WFmt F>() {
      if constexpr (prefill::supported(F)) {
        const auto launch = [&]<bool kGateUp>() {
          const auto kernel = prefill::experts_kernel<F, kGateUp>;
          constexpr size_t kSmem = prefill::smem_bytes(F);
          CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kSmem)));
          const int64_t items = max_units * prefill::n_tiles(F, kGateUp, g.inter, g.hidden);
          const int64_t grid = std::min(items, persistent_blocks(kernel, prefill::kThreads, kSmem));
          kernel<<<static_cast<unsigned>(grid), prefill::kThreads, kSmem, stream>>>(args);
          CUDA_CHECK_LAUNCH();
        };
        launch.template operator()<true>();
        args.a = args.h;
        launch.template operator()<false>();
      }
    });
  }
  const dim3 lora_grid(max_active, static_cast<unsigned>(std::min<int64_t>(
                                       num_slots, moe_internal::kLoraBlocksPerExpert)));
  if (lora) {
    moe_internal::expert_lora_shrink_kernel<<<lora_grid, moe_internal::kLoraThreads, 0, stream>>>(
        b, lora_args, p.x, p.hidden);
    CUDA_CHECK_LAUNCH();
  }
  dispatch_format(weight_wfmt(l.gate), [&]<WFmt F>() {
    if (gemv_may_run) {
      if (gate_up_gemv_vec) {
        gate_up_small_kernel<F, true>
            <<<blocks(g.inter, kSmallWarps * kGemvRows), kSmallWarps * 32, 0, stream>>>(
                g, table, b, p.x, h, lora_args);
      } else {
        gate_up_small_kernel<F, false>
            <<<blocks(g.inter, kSmallWarps * kGemvRows), kSmallWarps * 32, 0, stream>>>(
                g, table, b, p.x, h, lora_args);
      }
      CUDA_CHECK_LAUNCH();
    }
    const auto gate_up_tiles = [&]<class T>() {
      if (experts.gate_up_aligned() && x_aligned) {
        gate_up_mma_kernel<T, F, true>
            <<<blocks(g.inter, kBN), kMmaThreads, 0, stream>>>(g, table, b, p.x, h, lora_args);
      } else {
        gate_up_mma_kernel<T, F, false>
            <<<blocks(g.inter, kBN), kMmaThreads, 0, stream>>>(g, table, b, p.x, h, lora_args);
      }
      CUDA_CHECK_LAUNCH();
    };
    if (small_tile_may_run) gate_up_tiles.template operator()<tile::SmallTile>();
    if (big_tile_may_run) gate_up_tiles.template operator()<tile::BigTile>();
  });
  dispatch_format(weight_wfmt(l.down), [&]<WFmt F>() {
    if (gemv_may_run) {
      if (down_gemv_vec) {
        down_small_kernel<F, true>
            <<<blocks(g.hidden, kSmallWarps * kGemvRows), kSmallWarps * 32, 0, stream>>>(
                g, table, b, h, slot_out);
      } else {
        down_small_kernel<F, false>
            <<<blocks(g.hidden, kSmallWarps * kGemvRows), kSmallWarps * 32, 0, stream>>>(
                g, table, b, h, slot_out);
      }
      CUDA_CHECK_LAUNCH();
    }
    const auto down_tiles = [&]<class T>() {
      if (experts.down_aligned()) {
        down_mma_kernel<T, F, true>
            <<<blocks(g.hidden, kBN), kMmaThreads, 0, stream>>>(g, table, b, h, slot_out);
      } else {
        down_mma_kernel<T, F, false>
            <<<blocks(g.hidden, kBN), kMmaThreads, 0, stream>>>(g, table, b, h, slot_out);
      }
      CUDA_CHECK_LAUNCH();
    };
    if (small_tile_may_run) down_tiles.template operator()<tile::SmallTile>();
    if (big_tile_may_run) down_tiles.template operator()<tile::BigTile>();
  });
  if (lora) {
    moe_internal::expert_lora_down_kernel<<<lora_grid, moe_internal::kLoraThreads, 0, stream>>>(
        b, lora_args, h, g.inter, slot_out, p.hidden);
    CUDA_CHECK_LAUNCH();
  }

  if (p.shared != nullptr) {
    mlp({.x = p.x,
         .w = p.shared,
         .y = shared_out,
         .num_tokens = p.num_tokens,
         .act = p.act,
         .lora = p.shared_lora},
        blas, at(lay.shared_ws), lay.total - lay.shared_ws, stream,
        batch_invariant ? LinearKernel::kBatchInvariant : LinearKernel::kAuto);
  }
  combine_kernel<<<static_cast<unsigned>(p.num_tokens), 256, 0, stream>>>(
      p.expert_ids, p.expert_weights, slot_out, shared_out, p.top_k, p.num_experts, offset,
      p.hidden, p.y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda
