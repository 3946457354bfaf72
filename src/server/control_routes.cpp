// The development routes of the OpenAI server (issue 48 item 4), registered with
// $VLLM_SERVER_DEV_MODE=1 as vLLM registers them: generation control (/pause, /resume,
// /is_paused), /reset_prefix_cache, sleep mode (/sleep, /wake_up, /is_sleeping) and the
// weight-transfer protocol (/init_weight_transfer_engine, /start_weight_update,
// /update_weights, /finish_weight_update, /get_world_size; engine/weight_transfer.h).
// Engine calls block (a pause that waits for the running requests, tensors arriving), so each
// runs on the control thread and answers from there; errors are OpenAI error JSON (400 for a
// bad request or a refused checkpoint, 500 for a failure of the engine or the group).
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/weight_transfer.h"
#include "server/control_queue.h"
#include "server/json_body.h"
#include "server/openai_protocol.h"
#include "server/openai_server.h"
#include "util/error.h"

namespace hyserve {

namespace {

using Json = nlohmann::ordered_json;

// A query flag: true/false (also 1/0), `fallback` when absent; RequestError otherwise.
bool bool_param(const HttpRequest& req, const char* name, bool fallback) {
  const std::optional<std::string> v = req.query_param(name);
  if (!v) return fallback;
  if (*v == "true" || *v == "True" || *v == "1") return true;
  if (*v == "false" || *v == "False" || *v == "0") return false;
  throw RequestError(name, std::string(name) + " must be true or false, got '" + *v + "'");
}

// Runs `work` on the control thread and answers with its JSON (empty: an empty 200).
template <typename Work>
void answer_later(ControlQueue& queue, HttpResponseWriter& w, Work work) {
  queue.post([w, work]() mutable {
    try {
      const std::optional<Json> body = work();
      if (body) {
        w.send(200, "application/json", body->dump());
      } else {
        w.send(200, "text/plain; charset=utf-8", "");
      }
    } catch (const RequestError& e) {
      w.send(e.status(), "application/json", error_body(e));
    } catch (const InvalidRequest& e) {
      w.send(400, "application/json", error_body(400, e.what(), e.param()));
    } catch (const CheckpointError& e) {
      w.send(400, "application/json", error_body(400, e.what()));
    } catch (const std::exception& e) {
      w.send(500, "application/json", error_body(500, e.what()));
    }
  });
}

const Json& object_field(const Json& body, const char* key) {
  const auto it = body.find(key);
  if (it == body.end() || !it->is_object()) {
    throw RequestError(key, std::string("'") + key + "' must be an object");
  }
  return *it;
}

WeightTransferInit parse_init(const Json& info) {
  WeightTransferInit init;
  try {
    init.master_address = info.value("master_address", init.master_address);
    init.master_port = info.value("master_port", init.master_port);
    init.rank_offset = info.value("rank_offset", init.rank_offset);
    init.world_size = info.value("world_size", init.world_size);
    init.timeout_s = info.value("timeout_s", init.timeout_s);
  } catch (const nlohmann::json::exception& e) {
    throw RequestError("init_info", std::string("init_info: ") + e.what());
  }
  if (init.timeout_s < 1) throw RequestError("init_info", "timeout_s must be >= 1");
  return init;
}

WeightTransferUpdate parse_update(const Json& info) {
  WeightTransferUpdate u;
  try {
    u.weights_path = info.value("weights_path", std::string());
    if (info.contains("names")) u.names = info.at("names").get<std::vector<std::string>>();
    if (info.contains("dtype_names"))
      u.dtype_names = info.at("dtype_names").get<std::vector<std::string>>();
    if (info.contains("shapes"))
      u.shapes = info.at("shapes").get<std::vector<std::vector<int64_t>>>();
  } catch (const nlohmann::json::exception& e) {
    throw RequestError("update_info", std::string("update_info: ") + e.what());
  }
  if (u.weights_path.empty() && u.names.empty()) {
    throw RequestError("update_info",
                       "update_info needs names (with dtype_names and shapes) or "
                       "weights_path");
  }
  return u;
}

}  // namespace

void OpenAIServer::add_control_routes() {
  control_ = std::make_unique<ControlQueue>();
  transfer_ = std::make_unique<WeightTransfer>(engine_, options_.weight_transfer_backend);
  const auto route = [this](const char* method, const char* path, auto handler) {
    http_.route(method, path, [this, handler](const HttpRequest& r, HttpResponseWriter& w) {
      try {
        handler(r, w);
      } catch (const RequestError& e) {
        w.send(e.status(), "application/json", error_body(e));
      } catch (const InvalidRequest& e) {
        w.send(400, "application/json", error_body(400, e.what(), e.param()));
      }
    });
  };
  route("POST", "/pause", [this](const HttpRequest& r, HttpResponseWriter& w) {
    // vLLM's mode=abort|wait|keep; its older wait_for_inflight_requests=true means wait.
    PauseMode mode =
        bool_param(r, "wait_for_inflight_requests", false) ? PauseMode::kWait : PauseMode::kAbort;
    if (const auto m = r.query_param("mode")) mode = parse_pause_mode(*m);
    const bool clear_cache = bool_param(r, "clear_cache", true);
    answer_later(*control_, w, [this, mode, clear_cache]() -> std::optional<Json> {
      engine_.pause(mode, clear_cache);
      return Json{{"status", "paused"}};
    });
  });
  route("POST", "/resume", [this](const HttpRequest&, HttpResponseWriter& w) {
    answer_later(*control_, w, [this]() -> std::optional<Json> {
      engine_.resume();
      return Json{{"status", "resumed"}};
    });
  });
  route("GET", "/is_paused", [this](const HttpRequest&, HttpResponseWriter& w) {
    w.send(200, "application/json", Json{{"is_paused", engine_.is_paused()}}.dump());
  });
  route("POST", "/reset_prefix_cache", [this](const HttpRequest&, HttpResponseWriter& w) {
    answer_later(*control_, w, [this]() -> std::optional<Json> {
      engine_.reset_prefix_cache();
      return std::nullopt;
    });
  });
  route("POST", "/sleep", [this](const HttpRequest& r, HttpResponseWriter& w) {
    if (!options_.enable_sleep_mode) {
      throw RequestError("",
                         "sleep mode is not enabled: start the server with --enable-sleep-mode");
    }
    const std::string level_text = r.query_param("level").value_or("1");
    int level = 0;
    if (level_text == "1" || level_text == "2") {
      level = level_text[0] - '0';
    } else {
      throw RequestError("level", "level must be 1 or 2, got '" + level_text + "'");
    }
    const PauseMode mode = parse_pause_mode(r.query_param("mode").value_or("wait"));
    answer_later(*control_, w, [this, level, mode]() -> std::optional<Json> {
      engine_.sleep(level, mode);
      return std::nullopt;
    });
  });
  route("POST", "/wake_up", [this](const HttpRequest& r, HttpResponseWriter& w) {
    std::vector<std::string> tags;
    for (const auto& [k, v] : r.query) {
      if (k == "tags") tags.push_back(v);
    }
    answer_later(*control_, w, [this, tags]() -> std::optional<Json> {
      engine_.wake_up(tags);
      return std::nullopt;
    });
  });
  route("GET", "/is_sleeping", [this](const HttpRequest&, HttpResponseWriter& w) {
    w.send(200, "application/json", Json{{"is_sleeping", engine_.sleep_level() > 0}}.dump());
  });
  route("POST", "/init_weight_transfer_engine",
        [this](const HttpRequest& r, HttpResponseWriter& w) {
          const WeightTransferInit init =
              parse_init(object_field(parse_json_body(r.body), "init_info"));
          answer_later(*control_, w, [this, init]() -> std::optional<Json> {
            transfer_->init(init);
            return Json{{"message", "weight transfer initialized"}};
          });
        });
  route("POST", "/start_weight_update", [this](const HttpRequest&, HttpResponseWriter& w) {
    answer_later(*control_, w, [this]() -> std::optional<Json> {
      transfer_->start();
      return Json{{"message", "weight update started"}};
    });
  });
  route("POST", "/update_weights", [this](const HttpRequest& r, HttpResponseWriter& w) {
    const WeightTransferUpdate u =
        parse_update(object_field(parse_json_body(r.body), "update_info"));
    answer_later(*control_, w, [this, u]() -> std::optional<Json> {
      transfer_->update(u);
      return Json{{"message", "weights received"}};
    });
  });
  route("POST", "/finish_weight_update", [this](const HttpRequest&, HttpResponseWriter& w) {
    answer_later(*control_, w, [this]() -> std::optional<Json> {
      const int64_t n = transfer_->finish();
      return Json{{"message", "weights updated"},
                  {"num_tensors", n},
                  {"weights_generation", engine_.weights_generation()}};
    });
  });
  route("GET", "/get_world_size", [this](const HttpRequest&, HttpResponseWriter& w) {
    // The server's ranks in the trainer's group: rank 0 alone (it relays to its workers), so
    // a trainer's world_size is its own ranks + 1.
    w.send(200, "application/json", Json{{"world_size", 1}}.dump());
  });
}

}  // namespace hyserve
