#include "client/agentic_workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "util/error.h"

namespace hyserve::client {
namespace {

// Draws by hand from the engine's 64-bit words (mt19937_64 is specified bit for bit), not
// through <random>'s distributions, whose algorithms differ between standard libraries:
// the same seed gives the same sessions everywhere.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}

  // Uniform in [0, 1).
  double unit() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  // Uniform in [low, high].
  int64_t integer(int64_t low, int64_t high) {
    const auto span = static_cast<uint64_t>(high - low) + 1;
    return low + static_cast<int64_t>(rng_() % span);
  }

  // Exponential with the given mean (inverse transform).
  double exponential(double mean) { return -mean * std::log1p(-unit()); }

  // Failures before the first success of probability p (inverse transform).
  int64_t geometric(double p) {
    if (p >= 1.0) return 0;
    return static_cast<int64_t>(std::floor(std::log1p(-unit()) / std::log1p(-p)));
  }

  // A length uniform in [floor(len (1 - r)), ceil(len (1 + r))], at least `minimum`.
  int64_t length(int64_t len, double ratio, int64_t minimum) {
    const auto low = static_cast<int64_t>(std::floor(static_cast<double>(len) * (1.0 - ratio)));
    const auto high = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1.0 + ratio)));
    return std::max(minimum, integer(low, std::max(low, high)));
  }

  std::vector<int32_t> ids(const std::vector<int32_t>& vocab, int64_t n) {
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (int32_t& id : out) id = vocab[static_cast<size_t>(integer(0, vocab.size() - 1))];
    return out;
  }

 private:
  std::mt19937_64 rng_;
};

void check_options(const AgenticOptions& o) {
  CHECK(o.num_sessions >= 0, "--num-prompts (sessions) must be >= 0");
  CHECK(o.system_len >= 0, "--agentic-system-len must be >= 0");
  CHECK(o.user_len >= 1, "--agentic-user-len must be >= 1");
  CHECK(o.tool_result_len >= 1, "--agentic-tool-result-len must be >= 1");
  CHECK(o.output_len >= 1, "--agentic-output-len must be >= 1");
  CHECK(o.range_ratio >= 0.0 && o.range_ratio < 1.0, "--random-range-ratio must be in [0, 1), got ",
        o.range_ratio);
  CHECK(o.tool_call_ratio >= 0.0 && o.tool_call_ratio <= 1.0,
        "--agentic-tool-call-ratio must be in [0, 1], got ", o.tool_call_ratio);
  CHECK(o.min_turns >= 1 && o.max_turns >= o.min_turns,
        "--agentic-min-turns must be >= 1 and <= --agentic-max-turns");
  CHECK(o.turns_dist == "geometric" || o.turns_dist == "uniform",
        "--agentic-turns-dist must be geometric or uniform, got '", o.turns_dist, "'");
  CHECK(o.turns_dist != "geometric" || o.mean_turns >= static_cast<double>(o.min_turns),
        "--agentic-mean-turns must be >= --agentic-min-turns");
  CHECK(o.think_time_dist == "exponential" || o.think_time_dist == "constant",
        "--agentic-think-time-dist must be exponential or constant, got '", o.think_time_dist, "'");
  CHECK(o.think_time_s >= 0.0 && std::isfinite(o.think_time_s),
        "--agentic-think-time-s must be >= 0");
}

// Turns of one session: min_turns + Geometric(p) cut at max_turns, p chosen so that the
// uncut mean is mean_turns; or uniform in [min_turns, max_turns].
int64_t draw_num_turns(Draw& draw, const AgenticOptions& o) {
  if (o.turns_dist == "uniform") return draw.integer(o.min_turns, o.max_turns);
  const double p = 1.0 / (o.mean_turns - static_cast<double>(o.min_turns) + 1.0);
  return std::min(o.max_turns, o.min_turns + draw.geometric(p));
}

}  // namespace

int64_t AgenticWorkload::num_turns() const {
  int64_t n = 0;
  for (const AgenticSession& s : sessions) n += static_cast<int64_t>(s.turns.size());
  return n;
}

AgenticWorkload make_agentic_workload(const AgenticOptions& o,
                                      const std::vector<int32_t>& vocab_ids) {
  check_options(o);
  CHECK(!vocab_ids.empty(), "agentic dataset: empty vocabulary");
  Draw draw(o.seed);
  AgenticWorkload w;
  w.system_ids = draw.ids(vocab_ids, o.system_len);
  w.sessions.resize(static_cast<size_t>(o.num_sessions));
  for (AgenticSession& s : w.sessions) {
    s.turns.resize(static_cast<size_t>(draw_num_turns(draw, o)));
    for (size_t k = 0; k < s.turns.size(); ++k) {
      AgenticTurn& t = s.turns[k];
      t.tool_result = k > 0 && draw.unit() < o.tool_call_ratio;
      t.new_ids = draw.ids(
          vocab_ids, draw.length(t.tool_result ? o.tool_result_len : o.user_len, o.range_ratio, 1));
      t.output_len = draw.length(o.output_len, o.range_ratio, 1);
      if (k > 0)
        t.think_time_s =
            o.think_time_dist == "constant" ? o.think_time_s : draw.exponential(o.think_time_s);
    }
  }
  return w;
}

AgenticConversation::AgenticConversation(const AgenticWorkload& workload, size_t session)
    : session_(workload.sessions.at(session)), context_(workload.system_ids) {}

std::vector<int32_t> AgenticConversation::prompt(size_t turn) const {
  CHECK(turn < session_.turns.size(), "agentic session: no turn ", turn);
  CHECK(turn == num_replies_, "agentic session: turn ", turn, "'s prompt needs ", turn,
        " replies, have ", num_replies_);
  std::vector<int32_t> out = context_;
  const std::vector<int32_t>& new_ids = session_.turns[turn].new_ids;
  out.insert(out.end(), new_ids.begin(), new_ids.end());
  return out;
}

void AgenticConversation::add_reply(size_t turn, const std::vector<int32_t>& reply_ids) {
  CHECK(turn == num_replies_ && turn < session_.turns.size(), "agentic session: reply to turn ",
        turn, " out of order");
  const std::vector<int32_t>& new_ids = session_.turns[turn].new_ids;
  context_.insert(context_.end(), new_ids.begin(), new_ids.end());
  context_.insert(context_.end(), reply_ids.begin(), reply_ids.end());
  ++num_replies_;
}

}  // namespace hyserve::client
