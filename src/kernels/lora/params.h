// LoRA (low-rank adapters, issue 48): y[t] += scale * (x[t] A^T) B^T for the tokens whose
// adapter has a pair (A, B) on this projection; the other tokens' rows are left untouched
// (bitwise). The pair of ops the GPU will need (Punica's shrink x A^T and expand . B^T) is
// one op here: the fp32 reference, one token at a time in a fixed order, so a token's bits
// never depend on its batch.
//
//   token_slots [T]      each token's adapter slot (-1: none)
//   module.slots [S]     slot s's matrices on this projection (a == null: none there)
//      a [rank, in]  b [out, rank]  (fp32, row-major, as PEFT's lora_A / lora_B)
#pragma once

#include <cstdint>

namespace hyserve {

// The largest rank (serve --max-lora-rank's limit; the CUDA kernel's shared vector).
inline constexpr int64_t kMaxLoraRank = 64;

struct LoraMatrices {
  const float* a = nullptr;  // [rank, in]
  const float* b = nullptr;  // [out, rank]
  int64_t rank = 0;
  float scale = 0.0f;  // lora_alpha / rank, or lora_alpha / sqrt(rank) (rsLoRA)
  bool empty() const { return a == nullptr; }
};

// One projection's adapters, indexed by slot.
struct LoraModule {
  const LoraMatrices* slots = nullptr;  // [num_slots]
  int64_t num_slots = 0;
  bool empty() const { return slots == nullptr; }
};

struct LoraParams {
  const float* x = nullptr;  // [num_tokens, in]
  float* y = nullptr;        // [num_tokens, out] (added to; must not overlap x)
  int64_t num_tokens = 0;
  int64_t in = 0;
  int64_t out = 0;
  const int32_t* token_slots = nullptr;  // [num_tokens], -1 or [0, module.num_slots)
  LoraModule module;
};

// The adapters of a gated MLP's three projections (a dense MLP, the shared experts or one
// routed expert), and the tokens' slots of the call they ride on.
struct MlpLora {
  const int32_t* token_slots = nullptr;  // [num_tokens of the MLP call]
  LoraModule gate, up, down;
};

namespace cpu {

// Throws on a slot out of range or matrices of another shape's rank; nothing to do for
// tokens of slot -1 or of a slot without matrices.
void lora_add(const LoraParams& p);

}  // namespace cpu
}  // namespace hyserve
