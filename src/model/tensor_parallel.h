// Tensor parallelism (DESIGN.md "Parallelism"): rank r of N holds 1/N of every layer's
// heads and MLP width, 1/N of the vocabulary rows of the embedding and lm_head, and the
// full rest (norms, the MLA latent projections, the DSA indexer, the router, the latent
// MoE's down/up projections):
//
//   column-split (rows of [out, in], by whole heads): MLA q_proj / q_b_proj / kv_b_proj /
//       g_proj; KDA q/k/v/b/f_b/g_b/g_proj, their conv filters, A_log, dt_bias; MLP and
//       expert gate/up (intermediate_size, moe_intermediate_size, shared experts)
//   row-split (columns): MLA and KDA o_proj, MLP and expert down
//   vocab-split (rows of [V, D], VocabShard): embed_tokens and lm_head (one shared shard
//       when tied); V need not divide by N, the last rank's share is shorter
//
// so that each layer's attention output, dense MLP output, MoE output (or, for the latent
// MoE, its combined latent before routed_expert_norm, K3.md §3.5, and the shared
// experts' output) is a partial sum the ranks all-reduce. The embedding is one too (each
// rank looks up its own rows, zeros for the others); lm_head's logits are gathered, each
// rank's [T, stride] slice placed at its columns of [T, V]. The model on a rank runs with
// the local config (shard_config): its heads and widths are the rank's share, so the KDA
// state it caches is its heads' only; latents and index keys are replicated.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/weight.h"
#include "model/config.h"
#include "model/weights.h"
#include "parallel/parallel_layout.h"

namespace hyserve {

// The layout's pieces (parallel/parallel_layout.h) under the names the model code uses.
using parallel::ContextParallel;
using parallel::ParallelLayout;
using parallel::TensorParallel;

// The config a rank runs: heads and intermediate widths divided by tp.size (vocab_size
// stays the whole vocabulary: the logits are). Throws ConfigError naming the field when one
// does not divide, or when vocab_size is too small to give every rank rows.
// expert_parallel: routed experts stay whole (moe_intermediate_size undivided) and go to
// ranks by index instead: n_routed_experts must divide by tp_size (ConfigError naming it).
ModelConfig shard_config(const ModelConfig& full, int tp_size, bool expert_parallel = false);

// Expert parallelism: rank r of N keeps routed experts [first, first + count) of E,
// count = E / N.
struct ExpertShard {
  int64_t first = 0;
  int64_t count = 0;
};
ExpertShard expert_shard(int64_t num_experts, int rank, int size);

// Rows [rank * n, (rank + 1) * n) of w, n = w.rows / size: a view into w. FP8 shares must
// be whole 128-row scale blocks. Throws CheckpointError naming `what` otherwise.
Weight row_shard(const Weight& w, int rank, int size, const std::string& what);
// The vocabulary rows [first, first + rows) rank r of N keeps of embed_tokens and lm_head:
// shares of stride = ceil(vocab_size / N) rows, the last one shorter when N does not divide
// vocab_size.
//
//   vocab rows  | rank 0: stride | rank 1: stride | ... | rank N-1: rows <= stride |
//   first       0                stride                 (N-1) * stride
struct VocabShard {
  int64_t first = 0;
  int64_t rows = 0;
  int64_t stride = 0;
};
VocabShard vocab_shard(int64_t vocab_size, int rank, int size);
// Rows [shard.first, shard.first + shard.rows) of a [vocab, D] table: a view. FP8 shares
// must keep whole 128-row scale blocks (stride a multiple of 128). Throws CheckpointError
// naming `what` otherwise.
Weight vocab_rows(const Weight& w, const VocabShard& shard, const std::string& what);

// Columns [rank * n, (rank + 1) * n) of w, n = w.cols / size: a copy, its bytes kept in
// `owned`. Quantized shares must be whole scale groups (FP8 128, MXFP4 / INT4 32).
Weight col_shard(const Weight& w, int rank, int size, std::deque<std::vector<uint8_t>>& owned,
                 const std::string& what);

// Cuts the weights loaded for the full config down to rank's share (views into the
// checkpoint where the share is contiguous, copies kept in w.owned_bytes otherwise).
// Throws CheckpointError naming the tensor when a quantized format's blocks do not
// align with the cut (FP8 blocks of 128, MXFP4 / INT4 groups of 32).
// dcp: the DCP group size (kv_b_proj is cut for the group's heads: tp / dcp shares).
// expert_parallel: the rank's routed experts whole (expert_shard), the rest dropped.
void shard_weights(const ModelConfig& full, int rank, int size, LoadedWeights& w, int dcp = 1,
                   bool expert_parallel = false);

}  // namespace hyserve
