// The MoE's bf16 grouped GEMM on CUTLASS (grouped_gemm.h). CUTLASS's SM90 pointer-array
// grouped kernel is the field's Hopper grouped GEMM (TMA loads, warpgroup MMAs, a persistent
// tile scheduler over the groups); the one instantiation here serves gate/up (2E problems)
// and down (E problems). Problem shapes live on the device only: a setup kernel writes them
// from the buckets, an expert left to other kernels gets zero rows (no tiles).
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/moe/cuda/grouped_gemm.h"
#include "util/cuda_check.h"
#include "util/error.h"

namespace hyserve::cuda::moe_internal {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (m, n, k)
using ElementA = cutlass::bfloat16_t;  // rows of the expert [m, k], row-major
using LayoutA = cutlass::layout::RowMajor;
using ElementB = cutlass::bfloat16_t;  // the weight [n, k] row-major: column-major k x n
using LayoutB = cutlass::layout::ColumnMajor;
using ElementD = float;  // [m, n] row-major
using LayoutD = cutlass::layout::RowMajor;
using ElementAcc = float;
constexpr int kAlignAB = 8;  // 16 bytes
constexpr int kAlignD = 4;

using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc, void, LayoutD*,
    kAlignD, ElementD, LayoutD*, kAlignD, EpilogueSchedule,
    cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAcc, void,
                                                 ElementAcc>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignAB, ElementB,
    LayoutB*, kAlignAB, ElementAcc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

using StrideA = typename Kernel::InternalStrideA;
using StrideB = typename Kernel::InternalStrideB;
using StrideD = typename Kernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// Every stride's only dynamic mode is the first (the row pitch); the rest are static.
template <class S>
__host__ __device__ S row_stride(int64_t pitch) {
  static_assert(cute::is_static_v<std::decay_t<decltype(get<1>(S{}))>>,
                "the unit stride is static");
  S s{};
  get<0>(s) = pitch;
  return s;
}

// The problem list of one call, in the workspace.
struct Problems {
  Shape3* shapes;
  const ElementA** a;
  const ElementB** b;
  ElementD** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
};

constexpr size_t kAlign = 256;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

struct Layout {
  size_t shapes, a, b, d, sa, sb, sd, cutlass, total;
  explicit Layout(size_t problems) {
    size_t at = 0;
    const auto take = [&](size_t bytes) {
      const size_t here = at;
      at += align_up(bytes);
      return here;
    };
    shapes = take(problems * sizeof(Shape3));
    a = take(problems * sizeof(void*));
    b = take(problems * sizeof(void*));
    d = take(problems * sizeof(void*));
    sa = take(problems * sizeof(StrideA));
    sb = take(problems * sizeof(StrideB));
    sd = take(problems * sizeof(StrideD));
    cutlass = at;
    total = at;
  }
};

// The table's entries as moe_common.cuh's ExpertPtrs: data[3] then scales[3].
constexpr int kTableStride = 6;

__global__ void setup_kernel(ExpertGemm p, Problems q) {
  const int total = p.num_experts * p.num_projections;
  const auto* table = static_cast<const void* const*>(p.table);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int j = i / p.num_experts;
    const int4 rec = p.active[i % p.num_experts];
    const bool runs = rec.x >= 0 && rec.z >= p.min_rows;
    const int expert = runs ? rec.x : 0;
    const int64_t first = runs ? rec.y : 0;
    q.shapes[i] = Shape3(runs ? rec.z : 0, static_cast<int>(p.n), static_cast<int>(p.k));
    q.a[i] = reinterpret_cast<const ElementA*>(p.a) + first * p.a_pitch;
    q.b[i] = static_cast<const ElementB*>(table[expert * kTableStride + p.projection[j]]);
    q.d[i] = p.d[j] + first * p.d_pitch[j];
    q.sa[i] = row_stride<StrideA>(p.a_pitch);
    q.sb[i] = row_stride<StrideB>(p.k);
    q.sd[i] = row_stride<StrideD>(p.d_pitch[j]);
  }
}

int sm_count() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(counts.size()) <= device) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    counts[device] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  }
  return counts[device];
}

typename Gemm::Arguments arguments(const Problems& q, int problems) {
  cutlass::KernelHardwareInfo hw;
  CUDA_CHECK(cudaGetDevice(&hw.device_id));
  hw.sm_count = sm_count();
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {problems, q.shapes, nullptr},
      {const_cast<const ElementA**>(q.a), q.sa, const_cast<const ElementB**>(q.b), q.sb},
      {{}, nullptr, nullptr, q.d, q.sd},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return args;
}

}  // namespace

bool expert_gemm_supported(int64_t n, int64_t k) {
  return n > 0 && k > 0 && n % 8 == 0 && k % 8 == 0 && n <= INT32_MAX && k <= INT32_MAX;
}

size_t expert_gemm_workspace_bytes(int64_t num_experts, int num_projections) {
  const auto problems = static_cast<size_t>(num_experts * num_projections);
  const Layout lay(problems);
  const Problems none{};
  return lay.total +
         align_up(Gemm::get_workspace_size(arguments(none, static_cast<int>(problems))));
}

void expert_gemm_bf16(const ExpertGemm& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  CHECK(p.active != nullptr && p.table != nullptr && p.a != nullptr && p.d[0] != nullptr,
        "expert_gemm_bf16: null pointer");
  CHECK(p.num_projections == 1 || (p.num_projections == 2 && p.d[1] != nullptr),
        "expert_gemm_bf16: ", p.num_projections, " projections");
  CHECK(expert_gemm_supported(p.n, p.k), "expert_gemm_bf16: n ", p.n, " and k ", p.k,
        " must be positive multiples of 8");
  CHECK(p.num_experts > 0 && p.min_rows >= 1, "expert_gemm_bf16: ", p.num_experts,
        " experts, min_rows ", p.min_rows);
  CHECK(p.a_pitch >= p.k && p.a_pitch % 8 == 0, "expert_gemm_bf16: a pitch ", p.a_pitch, " for k ",
        p.k);
  for (int j = 0; j < p.num_projections; ++j) {
    CHECK(p.projection[j] >= 0 && p.projection[j] < 3, "expert_gemm_bf16: projection ",
          p.projection[j]);
    CHECK(p.d_pitch[j] >= p.n && p.d_pitch[j] % 4 == 0, "expert_gemm_bf16: d pitch ", p.d_pitch[j],
          " for n ", p.n);
  }
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  CHECK(aligned(p.a) && aligned(p.d[0]) && (p.num_projections == 1 || aligned(p.d[1])),
        "expert_gemm_bf16: a and d must be 16-byte aligned");
  const int problems = p.num_experts * p.num_projections;
  const Layout lay(static_cast<size_t>(problems));
  auto* base = static_cast<char*>(workspace);
  const Problems q{reinterpret_cast<Shape3*>(base + lay.shapes),
                   reinterpret_cast<const ElementA**>(base + lay.a),
                   reinterpret_cast<const ElementB**>(base + lay.b),
                   reinterpret_cast<ElementD**>(base + lay.d),
                   reinterpret_cast<StrideA*>(base + lay.sa),
                   reinterpret_cast<StrideB*>(base + lay.sb),
                   reinterpret_cast<StrideD*>(base + lay.sd)};
  const typename Gemm::Arguments args = arguments(q, problems);
  const size_t need = lay.total + Gemm::get_workspace_size(args);
  CHECK(workspace != nullptr && workspace_bytes >= need, "expert_gemm_bf16: workspace of ",
        workspace_bytes, " bytes, ", problems, " problems need ", need);
  setup_kernel<<<(problems + 255) / 256, 256, 0, stream>>>(p, q);
  CUDA_CHECK_LAUNCH();
  Gemm gemm;
  CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess,
        "expert_gemm_bf16: CUTLASS cannot run n ", p.n, ", k ", p.k);
  CHECK(gemm.initialize(args, base + lay.cutlass, stream) == cutlass::Status::kSuccess,
        "expert_gemm_bf16: CUTLASS initialize failed");
  CHECK(gemm.run(stream) == cutlass::Status::kSuccess, "expert_gemm_bf16: CUTLASS launch failed");
  CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::cuda::moe_internal
