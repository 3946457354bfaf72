// The prompts a serving benchmark sends, as `vllm bench serve` builds them:
//   random   - token ids drawn uniformly from a vocabulary (a tokenizer's non-special
//              ids), input and output lengths uniform in [len * (1 - r), len * (1 + r)],
//              an optional shared prefix of random tokens in front of every prompt;
//   sharegpt - a ShareGPT-format JSON file: a list of {"conversations": [{"from", "value"},
//              ...]}; the first turn is the prompt, the second turn's length in tokens is
//              max_tokens (unless a fixed output length is given).
// The room holds no tokenizer: counting tokens of text is a function the caller passes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hyserve::client {

struct BenchRequest {
  std::string prompt_text;          // sent as text when prompt_ids is empty
  std::vector<int32_t> prompt_ids;  // sent as a list of token ids (/v1/completions)
  int64_t prompt_len = 0;           // tokens, 0 when unknown (then the server's usage counts)
  int64_t output_len = 0;           // max_tokens
};

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;  // tokens after the prefix
  int64_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  int64_t prefix_len = 0;    // tokens shared by every prompt
  uint64_t seed = 0;
};

// Prompts of random token ids drawn from `vocab_ids` (non-empty). Deterministic in seed.
std::vector<BenchRequest> make_random_requests(const RandomDatasetOptions& options,
                                               const std::vector<int32_t>& vocab_ids);

using TokenCounter = std::function<int64_t(std::string_view text)>;

struct ShareGptOptions {
  int64_t num_prompts = 1000;
  std::optional<int64_t> output_len;  // fixed max_tokens; else the second turn's length
  uint64_t seed = 0;
};

// Reads a ShareGPT file, shuffles the conversations with seed and takes the first
// num_prompts usable ones (at least two turns; with a token counter, vLLM's filter: prompt
// and output at least 4 tokens, prompt at most 1024, both at most 2048). Fewer usable
// conversations than asked are reused in order. Without a counter, prompt_len is 0 and
// output_len must be given. Throws InvalidArgument naming the file on a bad format.
std::vector<BenchRequest> load_sharegpt_requests(const std::filesystem::path& path,
                                                 const ShareGptOptions& options,
                                                 const TokenCounter& count_tokens);

}  // namespace hyserve::client
