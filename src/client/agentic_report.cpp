#include "client/agentic_report.h"

#include <fmt/format.h>

namespace hyserve::client {

std::string format_agentic_report(const AgenticRunResult& result, const AgenticWorkload& workload) {
  const AgenticContextStats stats = agentic_context_stats(result);
  std::string out = fmt::format("{:-^50}\n", "Agentic sessions");
  const auto row = [&out](const std::string& label, const std::string& value) {
    out += fmt::format("{:<40}{:<10}\n", label, value);
  };
  row("Sessions:", std::to_string(workload.sessions.size()));
  row("Turns:", std::to_string(workload.num_turns()));
  row("Mean context length (tokens):", fmt::format("{:.2f}", stats.mean_context_len));
  row("Max context length (tokens):", std::to_string(stats.max_context_len));
  for (size_t k = 0; k < stats.mean_context_len_by_turn.size(); ++k)
    row(fmt::format("Mean context of turn {} (tokens):", k),
        fmt::format("{:.1f}", stats.mean_context_len_by_turn[k]));
  if (result.num_replies_without_ids > 0)
    row("Replies without token ids:", std::to_string(result.num_replies_without_ids));
  out += std::string(50, '=') + "\n";
  return out;
}

void add_agentic_result(nlohmann::ordered_json& j, const AgenticRunResult& result,
                        const AgenticWorkload& workload) {
  const AgenticContextStats stats = agentic_context_stats(result);
  j["num_sessions"] = workload.sessions.size();
  j["num_turns"] = workload.num_turns();
  j["mean_context_len"] = stats.mean_context_len;
  j["max_context_len"] = stats.max_context_len;
  j["mean_context_len_by_turn"] = stats.mean_context_len_by_turn;
  j["num_replies_without_ids"] = result.num_replies_without_ids;
  std::vector<std::string> kinds;
  for (size_t i = 0; i < result.outcomes.size(); ++i) {
    const auto& session = workload.sessions[static_cast<size_t>(result.session_of[i])];
    kinds.push_back(session.turns[static_cast<size_t>(result.turn_of[i])].tool_result ? "tool"
                                                                                      : "user");
  }
  j["session_ids"] = result.session_of;
  j["turn_indices"] = result.turn_of;
  j["turn_kinds"] = kinds;
}

}  // namespace hyserve::client
