// --speculative-config: vLLM's JSON object read into the engine's SpeculativeConfig.
//
//   {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
//    "prompt_lookup_max": 5}
//   {"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 3.36}
//   {"method": "mtp", ...}, {"method": "draft_model", "model": "DIR", ...}  (refused until built)
//
// method: "ngram" (also "[ngram]"), "synthetic", "mtp" (or "deepseek_mtp"), "draft_model";
// without it a "model" of "[ngram]" means ngram and any other model draft_model, as in vLLM.
// ngram without prompt_lookup_min / _max takes 5 for both (one given: the other the same).
// draft_sample_method: "greedy" (default) or "probabilistic". disable_by_batch_size N: no
// drafts while N or more requests run. Other vLLM fields are refused by name, as is "dspark"
// (its drafter is not specified).
#pragma once

#include <string_view>

#include "engine/speculative.h"

namespace hyserve {

// Throws Error naming the field on a bad value, an unknown field or a method not supported.
SpeculativeConfig parse_speculative_config(std::string_view json);

}  // namespace hyserve
