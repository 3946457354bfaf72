// Reading counters from a server's `/metrics` (the Prometheus text format) so the benchmark
// can report what the server saw during the run, such as the prefix-cache hit rate from
// `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (vLLM's names, which
// hyserve serves too).
#pragma once

#include <optional>
#include <string_view>

namespace hyserve::client {

// The sum of every sample of the metric `name` (all label sets); nullopt when the text has
// no sample of it. `# HELP` / `# TYPE` lines and other metrics are skipped.
std::optional<double> sum_samples(std::string_view text, std::string_view name);

struct PrefixCacheCounters {
  double queries = 0;  // prompt tokens looked up
  double hits = 0;     // of them, found in the cache
};

// The prefix-cache counters of a /metrics text, or nullopt when it has none.
std::optional<PrefixCacheCounters> read_prefix_cache_counters(std::string_view text);

// hits / queries between two scrapes; nullopt when either is missing or no query happened.
std::optional<double> prefix_cache_hit_rate(const std::optional<PrefixCacheCounters>& before,
                                            const std::optional<PrefixCacheCounters>& after);

}  // namespace hyserve::client
