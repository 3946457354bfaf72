// The agentic workload of `hyserve bench serve --dataset-name agentic`, modelled on
// SemiAnalysis' AgentX: sessions of several turns, each turn resending the whole
// conversation so far, so that a prefix cache serves all but the newest tokens.
//
//   turn 0 prompt:  [system (shared by every session)] [user 0]
//   turn k prompt:  [turn k-1 prompt] [turn k-1 reply] [new k]
//                   new k = a user message, or (with probability tool_call_ratio) the
//                   result of the tool the previous reply called
//
// Prompts are token ids (sent to /v1/completions as `prompt: [ids]`) and the reply is the
// server's own output ids, so each prompt extends the previous one token for token: the
// prefix sharing is exact and every prompt length is known without a tokenizer. A session's
// turns go in order; turn k is sent think_time_s after turn k-1 finished.
//
// The plan (turn counts, lengths, new tokens, think times) is drawn from the seed alone, so
// it is the same whatever the server answers; only the replies come from the server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyserve::client {

struct AgenticOptions {
  int64_t num_sessions = 16;
  int64_t system_len = 2048;             // tokens of the system prompt every session shares
  int64_t user_len = 128;                // tokens of a user message
  int64_t tool_result_len = 512;         // tokens of a tool result
  int64_t output_len = 256;              // max_tokens of every turn
  double range_ratio = 0.0;              // user, tool and output lengths in [len(1-r), len(1+r)]
  double tool_call_ratio = 0.5;          // probability that turn k > 0 brings a tool result
  std::string turns_dist = "geometric";  // geometric | uniform
  int64_t min_turns = 1;
  int64_t max_turns = 16;
  double mean_turns = 6.0;                      // geometric: mean before the cut at max_turns
  std::string think_time_dist = "exponential";  // exponential | constant
  double think_time_s = 1.0;                    // mean seconds between turns
  uint64_t seed = 0;
};

struct AgenticTurn {
  bool tool_result = false;      // new_ids is a tool result (else a user message)
  std::vector<int32_t> new_ids;  // appended after the previous turn's reply
  int64_t output_len = 0;        // max_tokens
  double think_time_s = 0.0;     // wait after the previous turn ended (0 for turn 0)
};

struct AgenticSession {
  std::vector<AgenticTurn> turns;  // at least one
};

struct AgenticWorkload {
  std::vector<int32_t> system_ids;
  std::vector<AgenticSession> sessions;
  int64_t num_turns() const;
};

// Draws the workload from `vocab_ids` (non-empty). Deterministic in options.seed. Throws
// InvalidArgument naming the flag for a bad option.
AgenticWorkload make_agentic_workload(const AgenticOptions& options,
                                      const std::vector<int32_t>& vocab_ids);

// A session's growing context. prompt(k) is the prompt of turn k; add_reply(k, ids) appends
// turn k's reply, after which turn k + 1's prompt is known.
class AgenticConversation {
 public:
  AgenticConversation(const AgenticWorkload& workload, size_t session);

  // Turn `turn`'s prompt; needs the replies of every earlier turn.
  std::vector<int32_t> prompt(size_t turn) const;
  void add_reply(size_t turn, const std::vector<int32_t>& reply_ids);
  size_t num_replies() const { return num_replies_; }

 private:
  const AgenticSession& session_;
  std::vector<int32_t> context_;  // system, then each turn's new tokens and reply
  size_t num_replies_ = 0;
};

}  // namespace hyserve::client
