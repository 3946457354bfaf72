#include "server/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace hyserve {
namespace {

const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenLatencyBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                  0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                  7.5,  10.0,  20.0, 40.0,  80.0};
// prometheus-fastapi-instrumentator's default latency buckets (vLLM's http_* series).
const std::vector<double> kHttpBuckets = {0.1, 0.5, 1.0};
const std::vector<double> kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

std::string quote(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + prometheus_number(v) + "\n";
}

void counter(std::string& out, const std::string& name, const std::string& help,
             const std::string& labels, double v) {
  header(out, name, help, "counter");
  sample(out, name, labels, v);
}

void gauge(std::string& out, const std::string& name, const std::string& help,
           const std::string& labels, double v) {
  header(out, name, help, "gauge");
  sample(out, name, labels, v);
}

void histogram(std::string& out, const std::string& name, const std::string& help,
               const std::string& labels, const Histogram& h) {
  header(out, name, help, "histogram");
  h.render(out, name, labels);
}

// The process collector's figures (Prometheus' Python client reads the same files).
void process_metrics(std::string& out) {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return;
  // Fields after the command name "(...)", which may hold spaces: field 3 onwards.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return;
  std::istringstream rest(line.substr(close + 2));
  std::vector<std::string> f;
  for (std::string x; rest >> x;) f.push_back(x);
  if (f.size() < 22) return;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // f[0] is field 3: utime = 14, stime = 15, starttime = 22, vsize = 23, rss = 24.
  const double cpu = (std::stod(f[11]) + std::stod(f[12])) / ticks;
  double boot = 0.0;
  std::ifstream proc_stat("/proc/stat");
  for (std::string l; std::getline(proc_stat, l);) {
    if (l.rfind("btime ", 0) == 0) boot = std::stod(l.substr(6));
  }
  gauge(out, "process_virtual_memory_bytes", "Virtual memory size in bytes.", "", std::stod(f[20]));
  gauge(out, "process_resident_memory_bytes", "Resident memory size in bytes.", "",
        std::stod(f[21]) * page);
  gauge(out, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
        "", boot + std::stod(f[19]) / ticks);
  counter(out, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "",
          cpu);
  int64_t fds = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(d)) fds += e->d_name[0] != '.';
    closedir(d);
    --fds;  // the directory stream's own descriptor
  }
  gauge(out, "process_open_fds", "Number of open file descriptors.", "", static_cast<double>(fds));
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    gauge(out, "process_max_fds", "Maximum number of open file descriptors.", "",
          lim.rlim_cur == RLIM_INFINITY ? INFINITY : static_cast<double>(lim.rlim_cur));
  }
}

}  // namespace

std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::vector<double> buckets_1_2_5(double max) {
  std::vector<double> out;
  for (double m = 1.0;; m *= 10.0) {
    for (double f : {1.0, 2.0, 5.0}) {
      if (m * f > max) return out;
      out.push_back(m * f);
    }
  }
}

void Histogram::observe(double v) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (v <= buckets_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{" + labels + sep + "le=\"" + prometheus_number(buckets_[i]) + "\"} " +
           prometheus_number(static_cast<double>(cumulative)) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " +
         prometheus_number(static_cast<double>(count_)) + "\n";
  sample(out, name + "_count", labels, static_cast<double>(count_));
  sample(out, name + "_sum", labels, sum_);
}

ServerMetrics::ServerMetrics(std::string model_name, int64_t max_model_len,
                             int64_t max_num_batched_tokens)
    : model_name_(std::move(model_name)),
      ttft_(kTtftBuckets),
      itl_(kTokenLatencyBuckets),
      tpot_(kTokenLatencyBuckets),
      e2e_(kRequestLatencyBuckets),
      queue_(kRequestLatencyBuckets),
      inference_(kRequestLatencyBuckets),
      prefill_(kRequestLatencyBuckets),
      decode_(kRequestLatencyBuckets),
      prompt_tokens_(buckets_1_2_5(static_cast<double>(max_model_len))),
      generation_tokens_(buckets_1_2_5(static_cast<double>(max_model_len))),
      max_tokens_(buckets_1_2_5(static_cast<double>(max_model_len))),
      max_generation_tokens_(buckets_1_2_5(static_cast<double>(max_model_len))),
      n_({1, 2, 5, 10, 20}),
      iteration_tokens_([&] {
        std::vector<double> b = {1, 8};
        for (double x = 16; x <= 16384 && x <= static_cast<double>(max_num_batched_tokens);
             x *= 2) {
          b.push_back(x);
        }
        return b;
      }()) {}

void ServerMetrics::request_finished(const FinishedRequest& r) {
  std::lock_guard lk(mu_);
  ++success_[r.finish_reason];
  e2e_.observe(r.e2e_s);
  if (r.queue_s) queue_.observe(*r.queue_s);
  if (r.inference_s) inference_.observe(*r.inference_s);
  if (r.prefill_s) prefill_.observe(*r.prefill_s);
  if (r.decode_s) decode_.observe(*r.decode_s);
  tpot_.observe(r.time_per_output_token_s.value_or(0.0));
  prompt_tokens_.observe(static_cast<double>(r.num_prompt_tokens));
  generation_tokens_.observe(static_cast<double>(r.num_generation_tokens));
  if (r.max_tokens) max_tokens_.observe(static_cast<double>(*r.max_tokens));
}

void ServerMetrics::first_token(double ttft_s) {
  std::lock_guard lk(mu_);
  ttft_.observe(ttft_s);
}

void ServerMetrics::inter_token(double seconds) {
  std::lock_guard lk(mu_);
  itl_.observe(seconds);
}

void ServerMetrics::step(int64_t num_scheduled_tokens) {
  if (num_scheduled_tokens <= 0) return;
  std::lock_guard lk(mu_);
  iteration_tokens_.observe(static_cast<double>(num_scheduled_tokens));
}

void ServerMetrics::generation_request(int64_t n, int64_t max_generation_tokens) {
  std::lock_guard lk(mu_);
  n_.observe(static_cast<double>(n));
  max_generation_tokens_.observe(static_cast<double>(max_generation_tokens));
}

void ServerMetrics::http_request(const std::string& handler, const std::string& method, int status,
                                 double seconds) {
  std::lock_guard lk(mu_);
  ++http_counts_[{handler, method, std::to_string(status / 100) + "xx"}];
  http_duration_.try_emplace({handler, method}, kHttpBuckets).first->second.observe(seconds);
}

void ServerMetrics::set_cache_config(std::vector<std::pair<std::string, std::string>> labels) {
  std::lock_guard lk(mu_);
  cache_config_ = std::move(labels);
}

std::string ServerMetrics::render(const EngineStats& s) const {
  const std::string l = "model_name=" + quote(model_name_) + ",engine=\"0\"";
  std::string out;
  gauge(out, "vllm:num_requests_running", "Number of requests in model execution batches.", l,
        static_cast<double>(s.num_running));
  gauge(out, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", l,
        static_cast<double>(s.num_waiting));
  gauge(out, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", l,
        s.kv_cache_usage);
  counter(out, "vllm:prefix_cache_queries_total",
          "Prefix cache queries, in terms of number of queried tokens.", l,
          static_cast<double>(s.prefix_cache_queries));
  counter(out, "vllm:prefix_cache_hits_total",
          "Prefix cache hits, in terms of number of cached tokens.", l,
          static_cast<double>(s.prefix_cache_hits));
  counter(out, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", l,
          static_cast<double>(s.num_preemptions));
  counter(out, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", l,
          static_cast<double>(s.prompt_tokens));
  counter(out, "vllm:generation_tokens_total", "Number of generation tokens processed.", l,
          static_cast<double>(s.generation_tokens));
  const SpecDecodeCounts& spec = s.spec_decode;
  counter(out, "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", l,
          static_cast<double>(spec.num_drafts));
  counter(out, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", l,
          static_cast<double>(spec.num_draft_tokens));
  counter(out, "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", l,
          static_cast<double>(spec.num_accepted_tokens));
  if (!spec.accepted_per_pos.empty()) {
    const std::string name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
    header(out, name, "Accepted tokens per draft position.", "counter");
    for (size_t i = 0; i < spec.accepted_per_pos.size(); ++i) {
      sample(out, name, l + ",position=\"" + std::to_string(i) + "\"",
             static_cast<double>(spec.accepted_per_pos[i]));
    }
  }

  std::lock_guard lk(mu_);
  header(out, "vllm:request_success_total", "Count of successfully processed requests.", "counter");
  for (const char* reason : {"stop", "length", "abort"}) {
    const auto it = success_.find(reason);
    sample(out, "vllm:request_success_total", l + ",finished_reason=\"" + reason + "\"",
           static_cast<double>(it == success_.end() ? 0 : it->second));
  }
  if (!cache_config_.empty()) {
    std::string labels = l;
    for (const auto& [k, v] : cache_config_) labels += "," + k + "=" + quote(v);
    gauge(out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels, 1.0);
  }
  histogram(out, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", l,
            iteration_tokens_);
  histogram(out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            l, ttft_);
  histogram(out, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            l, itl_);
  histogram(out, "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.", l, tpot_);
  histogram(out, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            l, e2e_);
  histogram(out, "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", l, queue_);
  histogram(out, "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.", l, inference_);
  histogram(out, "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.", l, prefill_);
  histogram(out, "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.", l, decode_);
  histogram(out, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", l,
            prompt_tokens_);
  histogram(out, "vllm:request_generation_tokens", "Number of generation tokens processed.", l,
            generation_tokens_);
  histogram(out, "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.", l,
            max_generation_tokens_);
  histogram(out, "vllm:request_params_n", "Histogram of the n request parameter.", l, n_);
  histogram(out, "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            l, max_tokens_);

  header(out, "http_requests_total", "Total number of requests by method, status and handler.",
         "counter");
  for (const auto& [key, count] : http_counts_) {
    const auto& [handler, method, status] = key;
    sample(out, "http_requests_total",
           "handler=" + quote(handler) + ",method=" + quote(method) + ",status=" + quote(status),
           static_cast<double>(count));
  }
  header(out, "http_request_duration_seconds",
         "Latency with only few buckets by handler and method.", "histogram");
  for (const auto& [key, h] : http_duration_) {
    h.render(out, "http_request_duration_seconds",
             "handler=" + quote(key.first) + ",method=" + quote(key.second));
  }
  process_metrics(out);
  return out;
}

}  // namespace hyserve
