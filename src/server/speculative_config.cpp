#include "server/speculative_config.h"

#include <cmath>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace hyserve {
namespace {

using nlohmann::json;

int64_t read_int(const json& j, const char* field) {
  CHECK(j.is_number_integer() ||
            (j.is_number_float() && std::floor(j.get<double>()) == j.get<double>()),
        "--speculative-config: ", field, " must be an integer, got ", j.dump());
  return j.is_number_integer() ? j.get<int64_t>() : static_cast<int64_t>(j.get<double>());
}

}  // namespace

SpeculativeConfig parse_speculative_config(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(str_cat("--speculative-config is not JSON: ", e.what()));
  }
  CHECK(j.is_object(), "--speculative-config must be a JSON object, got ", j.type_name());
  static const std::set<std::string> known = {
      "method", "num_speculative_tokens", "prompt_lookup_min",   "prompt_lookup_max",
      "model",  "acceptance_length",      "draft_sample_method", "disable_by_batch_size"};
  for (const auto& [key, value] : j.items()) {
    CHECK(known.contains(key), "--speculative-config: field '", key,
          "' is not supported (supported: method, num_speculative_tokens, prompt_lookup_min, "
          "prompt_lookup_max, model, acceptance_length, draft_sample_method, "
          "disable_by_batch_size)");
  }
  const auto get = [&](const char* key) -> const json* {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  SpeculativeConfig c;
  std::string method;
  if (const json* m = get("method")) {
    CHECK(m->is_string(), "--speculative-config: method must be a string, got ", m->dump());
    method = m->get<std::string>();
  }
  if (const json* m = get("model")) {
    CHECK(m->is_string(), "--speculative-config: model must be a string, got ", m->dump());
    c.model = m->get<std::string>();
  }
  if (method.empty()) {
    CHECK(!c.model.empty(), "--speculative-config: needs a method (or a model)");
    method = c.model == "[ngram]" || c.model == "ngram" ? "ngram" : "draft_model";
  }
  if (method == "ngram" || method == "[ngram]") {
    c.method = SpeculativeMethod::kNgram;
  } else if (method == "synthetic") {
    c.method = SpeculativeMethod::kSynthetic;
  } else if (method == "mtp" || method == "deepseek_mtp") {
    c.method = SpeculativeMethod::kMtp;
  } else if (method == "draft_model") {
    c.method = SpeculativeMethod::kDraftModel;
    CHECK(!c.model.empty(), "--speculative-config: method draft_model needs a model");
  } else if (method == "dspark") {
    throw Error(
        "--speculative-config: method 'dspark' is refused until its drafter is specified; "
        "use ngram, synthetic, mtp or draft_model");
  } else {
    throw Error(str_cat("--speculative-config: method '", method,
                        "' is not supported (ngram, synthetic, mtp, draft_model)"));
  }
  const json* n = get("num_speculative_tokens");
  CHECK(n != nullptr, "--speculative-config: num_speculative_tokens is required");
  c.num_speculative_tokens = read_int(*n, "num_speculative_tokens");
  if (c.method == SpeculativeMethod::kNgram) {
    const json* lo = get("prompt_lookup_min");
    const json* hi = get("prompt_lookup_max");
    c.prompt_lookup_min = lo ? read_int(*lo, "prompt_lookup_min") : 0;
    c.prompt_lookup_max = hi ? read_int(*hi, "prompt_lookup_max") : 0;
    if (!lo && !hi) c.prompt_lookup_min = c.prompt_lookup_max = 5;
    if (!lo && hi) c.prompt_lookup_min = c.prompt_lookup_max;
    if (lo && !hi) c.prompt_lookup_max = c.prompt_lookup_min;
  } else {
    CHECK(!get("prompt_lookup_min") && !get("prompt_lookup_max"),
          "--speculative-config: prompt_lookup_min / prompt_lookup_max are for method ngram");
  }
  if (const json* a = get("acceptance_length")) {
    CHECK(c.method == SpeculativeMethod::kSynthetic,
          "--speculative-config: acceptance_length is for method synthetic");
    CHECK(a->is_number(), "--speculative-config: acceptance_length must be a number, got ",
          a->dump());
    c.acceptance_length = a->get<double>();
  } else {
    CHECK(c.method != SpeculativeMethod::kSynthetic,
          "--speculative-config: method synthetic needs acceptance_length (the mean tokens per "
          "step, in [1, num_speculative_tokens + 1])");
  }
  if (const json* d = get("draft_sample_method")) {
    const std::string v = d->is_string() ? d->get<std::string>() : d->dump();
    CHECK(v == "greedy" || v == "probabilistic",
          "--speculative-config: draft_sample_method must be greedy or probabilistic, got ", v);
    c.probabilistic_drafts = v == "probabilistic";
  }
  if (const json* d = get("disable_by_batch_size")) {
    c.disable_by_batch_size = read_int(*d, "disable_by_batch_size");
    CHECK(c.disable_by_batch_size >= 2,
          "--speculative-config: disable_by_batch_size must be "
          ">= 2, got ",
          c.disable_by_batch_size);
  }
  validate(c);
  return c;
}

}  // namespace hyserve
