// `hyserve send-weights --url URL --folder DIR`: the trainer's side of the weight-transfer
// protocol (issue 48 item 4), for a trainer that writes its weights to a safetensors folder
// (and as the reference client of the routes): it serves the rendezvous store, joins the
// server's group as rank 0 over Gloo (CPU servers), and broadcasts the folder's tensors
// (all, or --names) in chunks of --chunk-mib, each announced by POST /update_weights; then
// POST /finish_weight_update. --via-folder sends the folder's path instead (no group; the
// server reads the files). The server needs VLLM_SERVER_DEV_MODE=1 and, for the broadcast,
// --weight-transfer-config '{"backend": "gloo"}'.
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "client/bench_runner.h"
#include "model/checkpoint.h"
#include "parallel/make_communicator.h"
#include "parallel/store.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve::cli {
namespace {

struct SendArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string folder;
  std::vector<std::string> names;
  std::string master_address = "127.0.0.1";
  int master_port = 0;
  double chunk_mib = 1024;
  int timeout_s = 300;
  bool via_folder = false;
};

// POST path with body; the reply's JSON text, or Error naming the route and the server's
// message.
std::string post(const client::BaseUrl& url, const std::string& path, const nlohmann::json& body,
                 int timeout_s) {
  const client::HttpReply r = client::http_post_json(url, path, body.dump(), timeout_s);
  CHECK_AS(Error, r.error.empty(), "send-weights: POST ", path, ": ", r.error);
  CHECK_AS(Error, r.status == 200, "send-weights: POST ", path, ": HTTP ", r.status, ": ", r.body);
  return r.body;
}

int run_send_weights(const SendArgs& a) {
  const client::BaseUrl url = client::parse_base_url(a.url);
  const Checkpoint source = Checkpoint::open(a.folder);
  std::vector<std::string> names = a.names.empty() ? source.names() : a.names;
  for (const std::string& n : names) {
    CHECK_AS(Error, source.find(n) != nullptr, "send-weights: no tensor ", n, " in ", a.folder);
  }
  if (a.via_folder) {
    CHECK_AS(Error, a.names.empty(),
             "send-weights: --via-folder sends the whole folder (no --names)");
    post(url, "/start_weight_update", nlohmann::json::object(), a.timeout_s);
    post(url, "/update_weights", {{"update_info", {{"weights_path", a.folder}}}}, a.timeout_s);
    std::printf("%s\n",
                post(url, "/finish_weight_update", nlohmann::json::object(), a.timeout_s).c_str());
    return 0;
  }
  parallel::TcpStoreOptions so;
  so.host = a.master_address;
  so.port = a.master_port;
  so.is_server = true;
  parallel::TcpStore store(so);
  const auto timeout = std::chrono::seconds(a.timeout_s);
  // The server joins while answering this POST: both sides block until the group forms.
  auto joined = std::async(std::launch::async, [&] {
    return post(
        url, "/init_weight_transfer_engine",
        {{"init_info",
          {{"master_address", a.master_address == "0.0.0.0" ? "127.0.0.1" : a.master_address},
           {"master_port", store.port()},
           {"rank_offset", 1},
           {"world_size", 2},
           {"timeout_s", a.timeout_s}}}},
        a.timeout_s + 30);
  });
  std::unique_ptr<parallel::Communicator> comm =
      parallel::make_cpu_communicator(store, 0, 2, timeout, "weight_transfer");
  joined.get();
  post(url, "/start_weight_update", nlohmann::json::object(), a.timeout_s);
  const auto chunk_bytes = static_cast<int64_t>(a.chunk_mib * 1024 * 1024);
  int64_t total = 0;
  for (size_t i = 0; i < names.size();) {
    nlohmann::json info = {{"names", nlohmann::json::array()},
                           {"dtype_names", nlohmann::json::array()},
                           {"shapes", nlohmann::json::array()}};
    std::vector<const TensorInfo*> chunk;
    int64_t bytes = 0;
    for (; i < names.size() && (chunk.empty() || bytes < chunk_bytes); ++i) {
      const TensorInfo* t = source.find(names[i]);
      info["names"].push_back(t->name);
      info["dtype_names"].push_back(std::string(dtype_name(t->dtype)));
      info["shapes"].push_back(t->shape);
      chunk.push_back(t);
      bytes += t->num_bytes;
    }
    auto announced = std::async(std::launch::async, [&] {
      return post(url, "/update_weights", {{"update_info", info}}, a.timeout_s);
    });
    for (const TensorInfo* t : chunk) {
      std::vector<uint8_t> data(t->data, t->data + t->num_bytes);
      comm->broadcast(data.data(), data.size(), 0);
    }
    announced.get();
    total += bytes;
  }
  const std::string done =
      post(url, "/finish_weight_update", nlohmann::json::object(), a.timeout_s);
  log::info("send-weights: {} tensors, {} bytes sent", names.size(), total);
  std::printf("%s\n", done.c_str());
  return 0;
}

}  // namespace

std::function<int()> add_send_weights_command(CLI::App& app) {
  auto args = std::make_shared<SendArgs>();
  CLI::App* cmd = app.add_subcommand(
      "send-weights", "push a safetensors folder's tensors into a running server (RL weight sync)");
  cmd->add_option("--url", args->url, "the server's base URL")->capture_default_str();
  cmd->add_option("--folder", args->folder, "the safetensors folder to send")->required();
  cmd->add_option("--names", args->names, "only these tensors (default: all)")->expected(1, -1);
  cmd->add_option("--master-address", args->master_address,
                  "the address the server reaches this process at")
      ->capture_default_str();
  cmd->add_option("--master-port", args->master_port, "the rendezvous port (0: a free one)")
      ->capture_default_str();
  cmd->add_option("--chunk-mib", args->chunk_mib, "tensors announced per /update_weights call")
      ->capture_default_str();
  cmd->add_option("--timeout", args->timeout_s, "seconds for each step")->capture_default_str();
  cmd->add_flag("--via-folder", args->via_folder,
                "send the folder's path for the server to read (no group)");
  return [args] { return run_send_weights(*args); };
}

}  // namespace hyserve::cli
