#include "client/prometheus_text.h"

#include <exception>
#include <string>

namespace hyserve::client {

std::optional<double> sum_samples(std::string_view text, std::string_view name) {
  std::optional<double> sum;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line.front() == '#' || line.substr(0, name.size()) != name) continue;
    line.remove_prefix(name.size());
    if (line.empty() || (line.front() != '{' && line.front() != ' ')) continue;  // a longer name
    if (line.front() == '{') {
      const size_t close = line.rfind('}');
      if (close == std::string_view::npos) continue;
      line.remove_prefix(close + 1);
    }
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    const std::string value(line.substr(0, line.find(' ')));  // a timestamp may follow
    try {
      size_t used = 0;
      const double v = std::stod(value, &used);
      if (used != value.size()) continue;
      sum = sum.value_or(0.0) + v;
    } catch (const std::exception&) {
      continue;  // not a number: not a sample
    }
  }
  return sum;
}

std::optional<PrefixCacheCounters> read_prefix_cache_counters(std::string_view text) {
  const auto queries = sum_samples(text, "vllm:prefix_cache_queries_total");
  const auto hits = sum_samples(text, "vllm:prefix_cache_hits_total");
  if (!queries || !hits) return std::nullopt;
  return PrefixCacheCounters{*queries, *hits};
}

std::optional<double> prefix_cache_hit_rate(const std::optional<PrefixCacheCounters>& before,
                                            const std::optional<PrefixCacheCounters>& after) {
  if (!before || !after) return std::nullopt;
  const double queries = after->queries - before->queries;
  if (queries <= 0) return std::nullopt;
  return (after->hits - before->hits) / queries;
}

}  // namespace hyserve::client
