// What the agentic workload adds to a benchmark's report and result JSON: sessions, turns,
// the context length per turn (how long the resent conversation grew) and the replies that
// came without token ids. The prefix-cache hit rate (from /metrics) is in the common report.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "client/agentic_runner.h"

namespace hyserve::client {

// Lines after the common result table, ending in a newline.
std::string format_agentic_report(const AgenticRunResult& result, const AgenticWorkload& workload);

// Adds to a result_json document: num_sessions, num_turns, mean/max_context_len,
// mean_context_len_by_turn, num_replies_without_ids, and per request (beside input_lens)
// session_ids, turn_indices and turn_kinds ("user": a user message was appended, "tool": a
// tool result).
void add_agentic_result(nlohmann::ordered_json& j, const AgenticRunResult& result,
                        const AgenticWorkload& workload);

}  // namespace hyserve::client
