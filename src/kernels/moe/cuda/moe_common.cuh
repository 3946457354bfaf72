// What the CUDA MoE expert kernels share (moe.cu, moe_decode.cuh): the per-expert pointer
// table, the buckets of sorted slots, the geometry of one call and which kernel takes an
// expert by its token count.
#pragma once

#include <cstdint>

#include "kernels/linear/cuda/dequant.cuh"
#include "kernels/linear/cuda/mma_tile.cuh"
#include "kernels/mlp/params.h"

namespace hyserve::cuda::moe_internal {

// One expert's three matrices on the device.
struct ExpertPtrs {
  const void* data[3];    // gate, up, down
  const void* scales[3];  // null for dense
};

// What every kernel needs to find its expert's tokens.
// A block finds its expert with one load (a chain of dependent loads costs microseconds
// in a decode step's small kernels).
struct Buckets {
  const int4* active;           // [E] {expert, first sorted position, count, 0} of the experts
                                //     with tokens, ascending, then {-1, 0, 0, 0}
  const int32_t* sorted_slots;  // [S] slot ids, bucketed by expert
};

// Which kernel runs an expert: by its token count n.
enum class Path {
  kDecode,     // n <= decode_max_tokens: the decode tensor-core kernels (moe_decode.cuh)
  kGemv,       // n < mma_min_tokens (formats the decode kernels do not take)
  kSmallTile,  // mma_min_tokens <= n <= 16: the small tensor-core tile (deep k steps)
  kBigTile,    // n > 16 (and >= mma_min_tokens)
};

// Shapes and formats shared by all experts (data / scales are filled per expert).
struct Geometry {
  WRef gate, up, down;
  int64_t hidden = 0;
  int64_t inter = 0;
  int64_t top_k = 0;
  int32_t mma_min_tokens = 16;    // experts with fewer tokens run the GEMV kernels...
  int32_t decode_max_tokens = 0;  // ...unless they have at most this many (0 or 16)
  GatedActivation act;            // between gate/up and down, every expert
};

__device__ __forceinline__ WRef with_expert(WRef w, const ExpertPtrs& e, int i) {
  w.data = static_cast<const uint8_t*>(e.data[i]);
  w.scales = e.scales[i];
  return w;
}

__device__ __forceinline__ Path path_for(const Geometry& g, int32_t n) {
  if (n <= g.decode_max_tokens) return Path::kDecode;
  return n < g.mma_min_tokens            ? Path::kGemv
         : n <= tile::SmallTile::kTokens ? Path::kSmallTile
                                         : Path::kBigTile;
}

// This block's expert (the `index`-th active one) if it has tokens of the wanted kind.
struct Assignment {
  int32_t expert = -1;
  int32_t begin = 0;  // first sorted position
  int32_t count = 0;
};

template <Path kPath>
__device__ __forceinline__ Assignment assign(const Geometry& g, const Buckets& b, unsigned index) {
  Assignment a;
  const int4 rec = b.active[index];  // index < E
  if (rec.x < 0 || path_for(g, rec.z) != kPath) return a;
  a.expert = rec.x;
  a.begin = rec.y;
  a.count = rec.z;
  return a;
}

}  // namespace hyserve::cuda::moe_internal
