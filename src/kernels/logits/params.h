// Logits processing on the device (the model runner's logits processors, vLLM's
// definitions) and log-probabilities of chosen tokens. Every op works on `num_rows` rows of
// [num_rows, vocab] fp32 logits in the backend's memory; per-request state lives in rows of
// the runner's persistent batch (`rows[i]` is the persistent row of logits row i), so only
// what changed is uploaded each step.
//
// Order the runner applies them in (as the CPU engine did before):
//   1. penalties        repetition p over the distinct ids of prompt + outputs:
//                         l > 0 ? l / p : l * p   (p == 1: unchanged)
//                       presence / frequency over the outputs:
//                         l -= presence * (count > 0) + frequency * count
//   2. sparse adjust    logit_bias entries added (kAdd), then min_tokens bans set -inf (kBan)
//   3. token mask       guided decoding: ids whose bit is clear get -inf; when that leaves a
//                       row with no finite logit, its allowed ids get logit 0 instead (sampling
//                       then draws one of them); a row with no allowed id is left unchanged
// Logprobs are of the raw logits (before 1-3): the runner computes them first.
#pragma once

#include <cstdint>

namespace hyserve {

// Bits per word of a token mask; a row of a mask is ceil(vocab / 32) words, bit (id % 32)
// of word id / 32 set when id is allowed (or, for prompt masks, present).
inline constexpr int64_t kTokenMaskWordBits = 32;
constexpr int64_t token_mask_words(int64_t vocab) {
  return (vocab + kTokenMaskWordBits - 1) / kTokenMaskWordBits;
}

// Largest top_logprobs / logprobs count (vLLM's default max_logprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct PenaltyParams {
  float* logits = nullptr;        // [num_rows, vocab] in place
  const int32_t* rows = nullptr;  // [num_rows] persistent row of each logits row
  // Per persistent row (indexed by rows[i]):
  const float* repetition = nullptr;       // [max_rows] > 0; 1: off
  const float* presence = nullptr;         // [max_rows]; 0: off
  const float* frequency = nullptr;        // [max_rows]; 0: off
  const int32_t* output_counts = nullptr;  // [max_rows, vocab] occurrences among the outputs
  const uint32_t* prompt_mask = nullptr;   // [max_rows, token_mask_words(vocab)] ids in the prompt
  int64_t num_rows = 0;
  int64_t vocab = 0;
};

// counts[rows[i] * vocab + tokens[i]] += 1 for every i with tokens[i] in [0, vocab); tokens
// outside (e.g. -1 of a failed draw) are skipped. Several i may name the same row.
struct CountTokensParams {
  int32_t* counts = nullptr;        // [max_rows, vocab]
  const int32_t* rows = nullptr;    // [num_tokens]
  const int32_t* tokens = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  int64_t vocab = 0;
};

// Sparse per-entry adjustments: logits[row[e] * vocab + id[e]] += value[e] (kAdd) or = -inf
// (kBan). Entries of one call have distinct (row, id) pairs; ids outside [0, vocab) and rows
// outside [0, num_rows) are refused on the host (CPU) / skipped (CUDA).
enum class LogitAdjustMode { kAdd, kBan };
struct LogitAdjustParams {
  float* logits = nullptr;       // [num_rows, vocab] in place
  const int32_t* row = nullptr;  // [num_entries] logits row (not persistent row)
  const int32_t* id = nullptr;   // [num_entries]
  const float* value = nullptr;  // [num_entries] (kAdd only; may be null for kBan)
  int64_t num_entries = 0;
  int64_t num_rows = 0;
  int64_t vocab = 0;
  LogitAdjustMode mode = LogitAdjustMode::kAdd;
};

// Guided decoding masks for some rows of the batch.
struct TokenMaskParams {
  float* logits = nullptr;         // [num_rows, vocab] in place
  const int32_t* rows = nullptr;   // [num_masked] logits rows that have a mask
  const uint32_t* mask = nullptr;  // [num_masked, token_mask_words(vocab)]
  int64_t num_masked = 0;
  int64_t num_rows = 0;
  int64_t vocab = 0;
};

// Log-probabilities (log_softmax of the row, computed in double, rounded to float) of one
// target id per row, its rank, and the row's best `top_n` ids.
//   rank: 1 + the number of ids ranked before the target, the order being (logit desc, id
//         asc) with NaN last (sampling::rank_key's order for non-NaN values).
//   top:  the first top_n ids of that order with their logprobs.
struct LogprobParams {
  const float* logits = nullptr;     // [num_rows, vocab]
  const int32_t* targets = nullptr;  // [num_rows] the id scored in each row
  int64_t num_rows = 0;
  int64_t vocab = 0;
  int32_t top_n = 0;              // [0, kMaxTopLogprobs]
  float* logprob = nullptr;       // [num_rows] out
  int64_t* rank = nullptr;        // [num_rows] out
  int32_t* top_ids = nullptr;     // [num_rows, top_n] out (top_n > 0)
  float* top_logprobs = nullptr;  // [num_rows, top_n] out (top_n > 0)
};

}  // namespace hyserve
