#include "client/bench_dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace hyserve::client {
namespace {

// vLLM's bounds on a ShareGPT pair when lengths are known.
constexpr int64_t kMinSequenceTokens = 4;
constexpr int64_t kMaxPromptTokens = 1024;
constexpr int64_t kMaxTotalTokens = 2048;

// A length drawn uniformly from [floor(len * (1 - r)), ceil(len * (1 + r))].
int64_t draw_length(std::mt19937_64& rng, int64_t len, double ratio) {
  const auto low = static_cast<int64_t>(std::floor(static_cast<double>(len) * (1.0 - ratio)));
  const auto high = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1.0 + ratio)));
  return std::uniform_int_distribution<int64_t>(low, std::max(low, high))(rng);
}

}  // namespace

std::vector<BenchRequest> make_random_requests(const RandomDatasetOptions& options,
                                               const std::vector<int32_t>& vocab_ids) {
  CHECK(!vocab_ids.empty(), "random dataset: empty vocabulary");
  CHECK(options.num_prompts >= 0, "--num-prompts must be >= 0");
  CHECK(options.input_len >= 0 && options.prefix_len >= 0,
        "--random-input-len and --random-prefix-len must be >= 0");
  CHECK(options.input_len + options.prefix_len >= 1,
        "random dataset: prompts of 0 tokens (--random-input-len 0 without a prefix)");
  CHECK(options.output_len >= 1, "--random-output-len must be >= 1");
  CHECK(options.range_ratio >= 0.0 && options.range_ratio < 1.0,
        "--random-range-ratio must be in [0, 1), got ", options.range_ratio);
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<size_t> pick(0, vocab_ids.size() - 1);
  std::vector<int32_t> prefix(static_cast<size_t>(options.prefix_len));
  for (int32_t& id : prefix) id = vocab_ids[pick(rng)];
  std::vector<BenchRequest> requests(static_cast<size_t>(options.num_prompts));
  for (BenchRequest& r : requests) {
    const int64_t input_len = std::max<int64_t>(
        options.prefix_len > 0 ? 0 : 1, draw_length(rng, options.input_len, options.range_ratio));
    r.output_len = std::max<int64_t>(1, draw_length(rng, options.output_len, options.range_ratio));
    r.prompt_ids = prefix;
    for (int64_t i = 0; i < input_len; ++i) r.prompt_ids.push_back(vocab_ids[pick(rng)]);
    r.prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  }
  return requests;
}

std::vector<BenchRequest> load_sharegpt_requests(const std::filesystem::path& path,
                                                 const ShareGptOptions& options,
                                                 const TokenCounter& count_tokens) {
  CHECK(options.num_prompts >= 0, "--num-prompts must be >= 0");
  CHECK(count_tokens || options.output_len,
        "sharegpt dataset: without a tokenizer the output length must be given "
        "(--sharegpt-output-len)");
  std::ifstream in(path);
  CHECK(in, "cannot open dataset file ", path.string());
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    HYSERVE_THROW(InvalidArgument, path.string(), ": not JSON: ", e.what());
  }
  CHECK(data.is_array(), path.string(), ": a ShareGPT file is a JSON list of conversations");
  // Conversations with two text turns, as (prompt, reply).
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& entry : data) {
    if (!entry.is_object()) continue;
    const auto turns = entry.find("conversations");
    if (turns == entry.end() || !turns->is_array() || turns->size() < 2) continue;
    const auto& first = (*turns)[0];
    const auto& second = (*turns)[1];
    if (!first.contains("value") || !first["value"].is_string() || !second.contains("value") ||
        !second["value"].is_string())
      continue;
    pairs.emplace_back(first["value"].get<std::string>(), second["value"].get<std::string>());
  }
  std::mt19937_64 rng(options.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);

  std::vector<BenchRequest> usable;
  for (const auto& [prompt, reply] : pairs) {
    if (static_cast<int64_t>(usable.size()) == options.num_prompts) break;
    BenchRequest r;
    r.prompt_text = prompt;
    if (count_tokens) {
      r.prompt_len = count_tokens(prompt);
      const int64_t reply_len = options.output_len ? *options.output_len : count_tokens(reply);
      if (r.prompt_len < kMinSequenceTokens || r.prompt_len > kMaxPromptTokens) continue;
      if (!options.output_len &&
          (reply_len < kMinSequenceTokens || r.prompt_len + reply_len > kMaxTotalTokens))
        continue;
      r.output_len = reply_len;
    } else {
      r.output_len = *options.output_len;
    }
    usable.push_back(std::move(r));
  }
  CHECK(options.num_prompts == 0 || !usable.empty(), path.string(),
        ": no usable conversation (two turns of text, lengths in vLLM's bounds)");
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < options.num_prompts; ++i)
    requests.push_back(usable[static_cast<size_t>(i) % usable.size()]);
  return requests;
}

}  // namespace hyserve::client
