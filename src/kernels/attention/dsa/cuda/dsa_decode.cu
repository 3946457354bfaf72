// The whole DSA decode step (cuda.h): indexer -> top-k -> sparse MLA, three launches
// (six or seven kernels and one memset) into a caller-provided workspace:
//   scores [B * n_q, stride] fp32 | top-k workspace (its first part the histogram
//   [B * n_q, 2048] int32) | slots [B * n_q, topk] int32 (when the caller does not ask for
//   them) | sparse MLA splits
// stride = max_context rounded up to 4. The scores are the one round trip through memory
// left (B * n_q * max_context * 4 bytes written once, read by the top-k). Where it pays
// (dsa_indexer_fuses_histogram: small steps, or no resident block lost) the indexer
// builds the top-k's first radix histogram as it writes them, so the top-k reads the
// scores one time fewer; otherwise the top-k counts the bins in a pass of its own. Either
// way one memset before the indexer zeroes the histogram and the top-k's counters, so
// that the top-k's first kernel follows the indexer directly (dsa_common.cuh).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/attention/dsa/cuda.h"
#include "kernels/attention/dsa/cuda/dsa_common.cuh"
#include "util/cuda_check.h"

namespace hyserve::cuda {
namespace {

struct Step {
  DsaIndexerParams indexer;
  DsaTopkParams topk;
  DsaMlaParams mla;
  size_t scores_offset, topk_offset, slots_offset, mla_offset, total;
  size_t zero_bytes;  // from topk_offset, zeroed before the indexer
};

Step plan_step(const DsaDecodeParams& p, char* base) {
  Step s{};
  const int64_t rows = p.batch.num_requests * p.batch.num_q;
  const int64_t stride = std::max<int64_t>(4, (p.batch.max_context + 3) / 4 * 4);
  s.scores_offset = 0;
  auto* scores = reinterpret_cast<float*>(base + s.scores_offset);
  s.indexer = {.cache = p.cache,
               .batch = p.batch,
               .q8 = p.index_q8,
               .weights = p.index_weights,
               .num_heads = p.index_num_heads,
               .scores = scores,
               .score_stride = stride};
  s.topk_offset = s.scores_offset + dsa::align_up(sizeof(float) * rows * stride);
  s.topk = {.batch = p.batch,
            .block_size = p.cache.block_size,
            .scores = scores,
            .score_stride = stride,
            .topk = p.topk,
            .slots = p.slots,
            .positions = nullptr,
            .histogram = nullptr};
  if (dsa_indexer_fuses_histogram(p.batch, p.index_num_heads)) {
    // The indexer's histogram is the top-k workspace's own first part.
    s.indexer.histogram = reinterpret_cast<int*>(base + s.topk_offset);
    s.topk.histogram = s.indexer.histogram;
  }
  s.zero_bytes = dsa::topk_zero_bytes(s.topk);
  s.slots_offset = s.topk_offset + dsa::align_up(dsa_topk_workspace_bytes(s.topk));
  s.mla_offset = s.slots_offset;
  if (p.slots == nullptr) {
    s.topk.slots = reinterpret_cast<int32_t*>(base + s.slots_offset);
    s.mla_offset += dsa::align_up(sizeof(int32_t) * rows * p.topk);
  }
  s.mla = {.cache = p.cache,
           .batch = p.batch,
           .q_lat = p.q_lat,
           .q_pe = p.q_pe,
           .slots = s.topk.slots,
           .topk_width = p.topk,
           .num_heads = p.num_heads,
           .softmax_scale = p.softmax_scale,
           .o_lat = p.o_lat,
           .lse = p.lse};
  // A stand-in pointer so that the workspace plan marks the MLA call as sparse.
  if (s.mla.slots == nullptr) s.mla.slots = reinterpret_cast<const int32_t*>(base + s.slots_offset);
  s.total = s.mla_offset + dsa::align_up(dsa_mla_workspace_bytes(s.mla));
  return s;
}

}  // namespace

size_t dsa_decode_workspace_bytes(const DsaDecodeParams& p) {
  validate_sizes(p);
  dsa::check_cuda_limits(p.batch, "dsa_decode");
  return plan_step(p, nullptr).total;
}

void dsa_decode(const DsaDecodeParams& p, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, bool batch_invariant) {
  validate(p);
  // The CUDA-only limits; the three launches below check their own too.
  dsa::check_cuda_limits(p.batch, "dsa_decode");
  if (p.batch.num_requests == 0) return;
  dsa::check_cuda_limits(p.cache, "dsa_decode");
  CHECK(workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % dsa::kAlign == 0,
        "dsa_decode workspace must be non-null and 256-byte aligned");
  auto* base = static_cast<char*>(workspace);
  const Step s = plan_step(p, base);
  CHECK(workspace_bytes >= s.total, "dsa_decode workspace of ", workspace_bytes, " bytes, need ",
        s.total);
  CUDA_CHECK(cudaMemsetAsync(base + s.topk_offset, 0, s.zero_bytes, stream));
  dsa_indexer_scores(s.indexer, stream);
  // The indexer launches a kernel unless max_context is 0.
  dsa::topk_prezeroed(s.topk, base + s.topk_offset, s.slots_offset - s.topk_offset, stream,
                      /*after_kernel=*/p.batch.max_context > 0);
  dsa_mla_decode(s.mla, base + s.mla_offset, s.total - s.mla_offset, stream, batch_invariant);
}

}  // namespace hyserve::cuda
