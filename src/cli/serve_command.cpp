// `hyserve serve [MODEL_DIR] [flags]`: the OpenAI-compatible server, with vLLM's flag
// names (SERVING.md). The flags (serve_args.h) are checked before any weight loads; runs
// until SIGINT / SIGTERM, then drains in-flight requests. This file is the wiring: where
// the process sits in the tensor-parallel group, the worker processes, the rank's Worker
// (engine/worker.h: its model, warm-up and KV pool), the engine, the API server, the stop.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/serve_args.h"
#include "cli/worker_processes.h"
#include "engine/engine.h"
#include "engine/tensor_parallel_group.h"
#include "engine/worker.h"
#include "kv/cache_format.h"
#include "kv/memory_plan.h"
#include "model/attention_backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/step_channel.h"
#include "parallel/store.h"
#include "server/no_tokenizer.h"
#include "server/openai_server.h"
#include "server/speculative_config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

namespace fs = std::filesystem;

// Where this process sits in a tensor-parallel group.
struct GroupPlace {
  int size = 1;
  int rank = 0;
  int local_size = 1;  // ranks per node
  int local_rank = 0;
};

// What serve knows before any weight loads: the checked flags, the device, the checkpoint,
// the context length and where this process sits.
struct ServeSetup {
  CheckedServeFlags flags;
  std::string device;  // "cpu" or "cuda"
  fs::path dir;
  ModelConfig config;
  int64_t max_model_len = 0;
  GroupPlace group;
  std::optional<WorkerPlace> worker;  // this process is a spawned worker (HYSERVE_TP_RANK)
};

sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The signal that came within `timeout`, or 0.
int wait_signal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000) * 1000000L;
  const int sig = sigtimedwait(&signals, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

// A spawned worker's place from its environment, else the node's first rank. In a group,
// heads, widths or experts that do not divide fail here, by name, as does a node with
// fewer GPUs than its ranks.
GroupPlace place_in_group(const ServeArgs& a, const ModelConfig& config, const std::string& device,
                          const std::optional<WorkerPlace>& worker) {
  GroupPlace g;
  g.size = static_cast<int>(a.tensor_parallel_size);
  g.local_size = static_cast<int>(a.tensor_parallel_size / a.nnodes);
  if (worker) {
    CHECK(worker->rank < g.size, "HYSERVE_TP_RANK ", worker->rank, " outside the group of ",
          g.size);
    g.rank = worker->rank;
  } else {
    g.rank = static_cast<int>(a.node_rank) * g.local_size;
  }
  g.local_rank = g.rank % g.local_size;
  if (g.size > 1) {
    // Heads, widths or experts that do not divide fail here, by name.
    shard_config(config, g.size, a.enable_expert_parallel);
    if (device == "cuda" && !worker) {
      require(device_count_or_zero() >= g.local_size, "--tensor-parallel-size ", g.size, " over ",
              a.nnodes, " node(s) needs ", g.local_size, " GPUs on this node, ",
              device_count_or_zero(), " visible");
    }
  }
  return g;
}

ServeSetup prepare_serve(const ServeArgs& a) {
  ServeSetup s;
  s.flags = check_serve_flags(a);
  s.device = resolve_device(a);
  s.dir = a.model_dir.empty() ? default_model_dir() : fs::path(a.model_dir);
  // The config and the tokenizer before the weights: a bad flag or a missing tokenizer
  // fails in a moment.
  s.config = ModelConfig::load(s.dir);
  s.max_model_len = resolve_max_model_len(a, s.config);
  s.worker = worker_place_from_env();
  s.group = place_in_group(a, s.config, s.device, s.worker);
  return s;
}

// The rank's Worker (engine/worker.h) as the flags ask for it.
WorkerConfig worker_config(const ServeArgs& a, const ServeSetup& s) {
  WorkerConfig wc;
  wc.model_dir = s.dir;
  wc.device = s.device;
  wc.model.indexer_fp8 = parse_index_cache_dtype(a.index_cache_dtype) == IndexCacheDtype::kFp8;
  wc.model.batch_invariant = a.batch_invariant;
  wc.model.cpu_gemm = cpu::parse_cpu_gemm(a.cpu_gemm);
  wc.model.attention_backend = parse_attention_backend(a.attention_backend);
  wc.model.parallel.expert_parallel = a.enable_expert_parallel;
  wc.model.token_sharded_prefill = a.token_sharded_prefill;
  wc.kv_cache_dtype = parse_latent_cache_dtype(a.kv_cache_dtype);
  EngineConfig& ec = wc.engine;
  ec.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.scheduler.max_step_prefill_cost =
      a.max_step_prefill_cost.value_or(default_max_step_prefill_cost(ec.scheduler));
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_model_len = s.max_model_len;
  // Prefix caching is on unless --no-enable-prefix-caching (vLLM's default).
  ec.enable_prefix_caching = !a.no_enable_prefix_caching;
  if (!a.speculative_config.empty())
    ec.speculative = parse_speculative_config(a.speculative_config);
  // The next step is scheduled while this one runs unless --no-async-scheduling.
  ec.async_scheduling = !a.no_async_scheduling;
  // LoRA: the engine gives the model --max-loras slots (and runs without async scheduling).
  ec.scheduler.max_loras = a.enable_lora ? a.max_loras : 0;
  ec.max_lora_rank = a.max_lora_rank;
  wc.gpu_memory_utilization = a.gpu_memory_utilization;
  wc.kv_cache_memory_bytes = a.kv_cache_memory_bytes;
  wc.enforce_eager = a.enforce_eager;  // decode steps replay CUDA graphs unless given
  wc.dummy_weights = a.load_format == "dummy";
  return wc;
}

// The rank's place for its Worker, with the group's timeouts; `poll` runs while it waits.
WorkerGroup worker_group(const ServeArgs& a, const GroupPlace& g, parallel::Store* store,
                         std::function<void()> poll) {
  WorkerGroup wg;
  wg.rank = g.rank;
  wg.size = g.size;
  wg.dcp_size = static_cast<int>(a.decode_context_parallel_size);
  wg.store = store;
  wg.poll = std::move(poll);
  if (g.size > 1) {
    wg.timeout = distributed_timeout();
    wg.load_timeout = load_timeout();
  }
  return wg;
}

// A rank > 0 (a process `serve` started, or a --headless node's): its shard, then the
// plans of rank 0 until it says stop.
int run_worker_rank(const ServeArgs& a, const ServeSetup& s) {
  const GroupPlace& g = s.group;
  const std::string& master = s.worker->master;
  const size_t colon = master.rfind(':');
  const std::string host = master.substr(0, colon);
  parallel::TcpStoreOptions so;
  so.host = host;
  so.port = std::stoi(master.substr(colon + 1));
  so.connect_timeout = distributed_timeout();
  so.timeout = distributed_timeout();
  parallel::TcpStore store(so);
  log::info("rank {} of {}: loading {} ({})", g.rank, g.size, s.dir.string(), s.device);
  Worker worker(worker_config(a, s), worker_group(a, g, &store, {}));
  worker.run_leader_plans(host);
  return 0;
}

// A --headless node: its ranks as worker processes, until they stop (or one fails, or a
// signal comes).
int run_headless_node(const ServeArgs& a, const GroupPlace& g, const std::string& device) {
  const std::string master = str_cat(a.master_addr, ":", *a.master_port);
  const sigset_t signals = block_stop_signals();
  WorkerProcesses workers;
  for (int i = 0; i < g.local_size; ++i) workers.spawn(g.rank + i, i, master, device == "cuda");
  log::info("node {} of {} (headless): ranks {} .. {}, rendezvous at {}", a.node_rank, a.nnodes,
            g.rank, g.rank + g.local_size - 1, master);
  for (;;) {
    if (const int sig = wait_signal(signals, std::chrono::milliseconds(200))) {
      log::info("signal {}, stopping the workers", sig);
      workers.terminate(std::chrono::seconds(10));
      return 0;
    }
    while (const auto e = workers.poll_exit()) {
      if (!e->ok) {
        log::error("tensor parallel: {}; stopping this node's workers", e->what);
        workers.terminate(std::chrono::seconds(5));
        return 1;
      }
    }
    if (workers.all_exited()) return 0;
  }
}

// Rank 0's tokenizer, chat templates and special tokens; with --skip-tokenizer-init, token
// ids only.
struct TokenizerParts {
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplates templates;
  SpecialTokens special;
};

// --chat-template as vLLM reads it: a file when one opens; else, when the text holds '{', '}'
// or a newline, the template itself with its backslash escapes (\n, \t, \r, \\, \', \")
// decoded; else an error naming it (a file path that did not open).
std::string read_chat_template_arg(const std::string& arg) {
  std::ifstream file(arg, std::ios::binary);
  if (file && !std::filesystem::is_directory(arg)) {
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
  }
  CHECK(arg.find_first_of("{}\n") != std::string::npos, "--chat-template: ", arg,
        " looks like a file path, but it could not be opened");
  std::string out;
  for (size_t i = 0; i < arg.size(); ++i) {
    if (arg[i] != '\\' || i + 1 == arg.size()) {
      out += arg[i];
      continue;
    }
    switch (const char c = arg[++i]) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
      case '\'':
      case '"':
        out += c;
        break;
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

TokenizerParts load_tokenizer_parts(const ServeArgs& a, const ServeSetup& s) {
  TokenizerParts t;
  if (a.skip_tokenizer_init) {
    t.tokenizer = std::make_unique<NoTokenizer>(s.config.vocab_size);
    return t;
  }
  try {
    t.tokenizer = Tokenizer::load(s.dir);
  } catch (const TokenizerError& e) {
    throw Error(str_cat(e.what(), "; --skip-tokenizer-init serves token-id prompts without one"));
  }
  t.templates = load_chat_templates(s.dir);
  // DeepSeek-V3.2 ships its chat format as Python, not as a template: use the built-in
  // encoding (vLLM's deepseek_v32 tokenizer mode).
  if (t.templates.by_name.empty() && s.config.model_type == ModelType::kDeepseekV32)
    t.templates.builtin = "deepseek_v32";
  if (!a.chat_template.empty()) {
    // In place of every template the model ships (vLLM: the tokenizer's chat_template).
    std::string text = read_chat_template_arg(a.chat_template);
    try {
      ChatTemplate check(text);
    } catch (const jinja::TemplateError& e) {
      throw Error(str_cat("--chat-template: ", e.what()));
    }
    t.templates.by_name = {{"default", std::move(text)}};
    t.templates.builtin.clear();
  }
  t.special = load_special_tokens(s.dir);
  return t;
}

// Tensor parallelism: the rendezvous, then a worker process per local GPU slot (the other
// nodes start theirs with --headless). None for one rank.
std::unique_ptr<parallel::TcpStore> start_group(const ServeArgs& a, const ServeSetup& s,
                                                WorkerProcesses& workers) {
  const GroupPlace& g = s.group;
  if (g.size == 1) return nullptr;
  parallel::TcpStoreOptions so;
  so.host = a.nnodes > 1 ? "0.0.0.0" : a.master_addr;
  so.port = a.master_port.value_or(0);
  so.is_server = true;
  so.timeout = distributed_timeout();
  auto store = std::make_unique<parallel::TcpStore>(so);
  const std::string master = str_cat(a.master_addr, ":", store->port());
  for (int r = 1; r < g.local_size; ++r) workers.spawn(r, r, master, s.device == "cuda");
  log::info("tensor parallel: {} ranks on {} node(s), rendezvous at {}", g.size, a.nnodes, master);
  return store;
}

// The leader's engine config: the worker's, where generation also stops at the config's
// EOS ids and at the tokenizer's eos_token (for Kimi chat, <|im_end|>), as vLLM does.
EngineConfig leader_engine_config(const Worker& worker, const Model& model,
                                  const TokenizerParts& t) {
  EngineConfig ec = worker.engine_config();
  for (int64_t id : model.config().eos_token_ids)
    ec.scheduler.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (t.special.eos_token) {
    const int32_t id = t.tokenizer->token_id(*t.special.eos_token);
    if (id >= 0 && id < model.config().vocab_size) ec.scheduler.eos_token_ids.push_back(id);
  }
  return ec;
}

// The budget, as vLLM logs it: what the pool holds and how many full-length requests fit;
// then which kernels each layer runs.
void log_budget(const Worker& worker, const Model& model) {
  log::info(
      "{} (max_model_len); workspace {:.2f} GiB reserved (score chunk sized for "
      "max_model_len)",
      format_memory_summary(worker.cache_plan(), worker.memory_plan()),
      static_cast<double>(worker.engine_config().workspace_bytes) / (1024.0 * 1024.0 * 1024.0));
  for (const std::string& line : model.kernel_plan()) log::info("kernel plan: {}", line);
}

// The workers' step channel: its port through the store.
std::unique_ptr<parallel::LeaderChannel> open_step_channel(const ServeArgs& a, const GroupPlace& g,
                                                           parallel::Store& store) {
  auto channel = std::make_unique<parallel::LeaderChannel>(a.nnodes > 1 ? "0.0.0.0" : a.master_addr,
                                                           0, distributed_timeout());
  store.set("step_channel_port", parallel::encode_counter(channel->port()));
  channel->accept_workers(g.size);
  return channel;
}

OpenAIServerOptions server_options(const ServeArgs& a, const ServeSetup& s) {
  OpenAIServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.served_model_names = a.served_model_names.empty()
                              ? std::vector<std::string>{s.dir.filename().string()}
                              : a.served_model_names[0];
  so.model_root = s.dir.string();
  so.api_key = a.api_key;
  so.enable_auto_tool_choice = a.enable_auto_tool_choice;
  so.trust_request_chat_template = a.trust_request_chat_template;
  so.tool_call_parser = a.tool_call_parser;
  so.reasoning_parser = a.reasoning_parser;
  so.cors = s.flags.cors;
  so.skip_tokenizer_init = a.skip_tokenizer_init;
  so.max_sequences_per_request = a.max_sequences_per_request;
  so.max_connections = static_cast<int>(a.max_connections);
  so.idle_timeout_ms = s.flags.keep_alive_s * 1000;
  const char* lora_env = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
  const std::string allow = lora_env != nullptr ? lora_env : "";
  so.allow_runtime_lora_updating = allow == "1" || allow == "true" || allow == "True";
  const char* dev_env = std::getenv("VLLM_SERVER_DEV_MODE");
  const std::string dev = dev_env != nullptr ? dev_env : "";
  so.dev_mode = dev == "1" || dev == "true" || dev == "True";
  so.enable_sleep_mode = a.enable_sleep_mode;
  so.weight_transfer_backend = parse_weight_transfer_backend(a.weight_transfer_config);
  return so;
}

// Until a signal; with workers, also until one of them fails: a worker that exits or
// reports an error, or a step that failed (a hung worker: the collective's timeout).
// Returns the failure, none after a signal.
std::optional<std::string> wait_for_stop(const sigset_t& signals, const GroupPlace& g,
                                         parallel::LeaderChannel* channel, WorkerProcesses& workers,
                                         const Engine& engine, const LeaderLink* link) {
  std::optional<std::string> failure;
  for (;;) {
    const int sig = wait_signal(signals, std::chrono::milliseconds(200));
    if (sig > 0) {
      log::info("signal {}, draining", sig);
      return std::nullopt;
    }
    if (g.size == 1) continue;
    // A worker's own report first (its error message), then how its process ended.
    failure = channel->failure();
    if (const auto e = workers.poll_exit()) {
      failure = failure ? str_cat(*failure, "; ", e->what) : e->what;
    }
    if (!failure && !engine.alive()) {
      failure = link->diagnose(std::chrono::seconds(2))
                    .value_or("a step failed (the error above); the workers answered every step");
    }
    if (failure) return failure;
  }
}

// Rank 0: the tokenizer, the group, its own Worker, the engine and the API server, until
// a signal or a worker's failure.
int run_leader(const ServeArgs& a, const ServeSetup& s) {
  const GroupPlace& g = s.group;
  TokenizerParts t = load_tokenizer_parts(a, s);
  std::unique_ptr<parallel::TcpStore> store;
  WorkerProcesses workers;
  store = start_group(a, s, workers);
  const auto check_workers = [&] {
    if (const auto e = workers.poll_exit()) {
      throw Error(str_cat("tensor parallel: ", e->what, " while the group was starting"));
    }
  };
  Worker worker(worker_config(a, s), worker_group(a, g, store.get(), check_workers));
  std::unique_ptr<Model> model = worker.release_model();
  const EngineConfig ec = leader_engine_config(worker, *model, t);
  log_budget(worker, *model);
  std::unique_ptr<parallel::LeaderChannel> channel;
  std::unique_ptr<LeaderLink> link;
  if (g.size > 1) {
    channel = open_step_channel(a, g, *store);
    link = std::make_unique<LeaderLink>(*channel);
  }
  Engine engine(std::move(model), ec);
  for (const std::string& spec : a.lora_modules) {
    const LoraModuleSpec m = parse_lora_module(spec);
    engine.loras()->load(m.name, m.path, /*replace=*/false);
    log::info("LoRA adapter '{}' loaded from {}", m.name, m.path);
  }
  if (link) engine.set_plan_sink(link.get());
  engine.start();
  const OpenAIServerOptions so = server_options(a, s);
  OpenAIServer server(so, engine, *t.tokenizer, std::move(t.templates), std::move(t.special));

  // SIGINT / SIGTERM end the server; they are handled on this thread only.
  const sigset_t signals = block_stop_signals();
  server.start();
  log::info(
      "serving {} as '{}' on http://{}:{} (device {}, tensor parallel {}, max_model_len {}, KV "
      "cache {} blocks of {} tokens, prefix caching {})",
      s.dir.string(), so.served_model_names[0], a.host, server.port(), s.device, g.size,
      s.max_model_len, ec.num_blocks, worker.cache_plan().tokens_per_block(),
      ec.enable_prefix_caching ? "on" : "off");
  const std::optional<std::string> failure =
      wait_for_stop(signals, g, channel.get(), workers, engine, link.get());
  if (failure) log::error("tensor parallel: {}; the server stops", *failure);
  server.stop();
  engine.stop();
  if (link) link->stop();
  workers.terminate(std::chrono::seconds(failure ? 5 : 60));
  if (channel) channel->close(std::chrono::seconds(failure ? 1 : 30));
  return failure ? 1 : 0;
}

int run_serve(const ServeArgs& a) {
  const ServeSetup s = prepare_serve(a);
  if (s.worker) return run_worker_rank(a, s);
  if (a.headless) return run_headless_node(a, s.group, s.device);
  return run_leader(a, s);
}

}  // namespace

std::function<int()> add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server (vLLM's routes and flags)");
  add_serve_flags(*cmd, *a);
  return [a] { return run_serve(*a); };
}

}  // namespace hyserve::cli
