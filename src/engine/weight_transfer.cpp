#include "engine/weight_transfer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "model/tensor_source.h"
#include "parallel/make_communicator.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve {

namespace {

constexpr const char* kPrefix = "weight_transfer";

}  // namespace

DType parse_transfer_dtype(const std::string& name) {
  std::string n = name;
  if (n.starts_with("torch.")) n = n.substr(6);
  static const std::pair<const char*, DType> kTorch[] = {
      {"bfloat16", DType::kBF16},       {"float32", DType::kF32}, {"float", DType::kF32},
      {"float16", DType::kF16},         {"half", DType::kF16},    {"float8_e4m3fn", DType::kE4M3},
      {"float8_e8m0fnu", DType::kE8M0}, {"uint8", DType::kU8},    {"int8", DType::kI8},
      {"int32", DType::kI32},           {"int64", DType::kI64},   {"bool", DType::kBool}};
  for (const auto& [torch_name, dtype] : kTorch) {
    if (n == torch_name) return dtype;
  }
  if (const std::optional<DType> d = parse_dtype(n)) return *d;
  throw InvalidRequest("dtype_names", "unknown dtype '" + name + "'");
}

std::unique_ptr<Checkpoint> updated_checkpoint(const TensorSource& current,
                                               std::vector<OverrideTensor> staged) {
  const auto* ckpt = dynamic_cast<const Checkpoint*>(&current);
  if (ckpt == nullptr) {
    throw InvalidRequest("", "weight updates need a model loaded from a checkpoint folder");
  }
  for (const OverrideTensor& o : ckpt->overrides()) {
    const bool sent_again = std::any_of(staged.begin(), staged.end(), [&](const OverrideTensor& x) {
      return x.info.name == o.info.name;
    });
    if (!sent_again) staged.push_back(o);
  }
  return std::make_unique<Checkpoint>(Checkpoint::open_with(current.dir(), std::move(staged)));
}

OverrideTensor incoming_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                               const std::string& from) {
  for (int64_t d : shape) {
    if (d < 0) throw InvalidRequest("shapes", "tensor " + name + " has a negative dimension");
  }
  OverrideTensor t;
  t.info.name = std::move(name);
  t.info.dtype = dtype;
  t.info.shape = std::move(shape);
  t.info.num_bytes = t.info.num_elements() * dtype_size(dtype);
  t.info.file = "weight update from " + from;
  return t;
}

void relay_tensors(parallel::Communicator& comm, Device& device,
                   std::vector<OverrideTensor>& tensors, bool root) {
  for (OverrideTensor& t : tensors) {
    std::shared_ptr<std::vector<uint8_t>> bytes;
    if (root) {
      bytes = std::make_shared<std::vector<uint8_t>>(t.info.data, t.info.data + t.info.num_bytes);
    } else {
      bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(t.info.num_bytes));
    }
    if (device.kind() == DeviceKind::kCpu) {
      comm.broadcast(bytes->data(), bytes->size(), 0);
    } else {
      DeviceAllocation buffer(&device, bytes->size());
      if (root) device.upload(buffer.data(), bytes->data(), bytes->size());
      comm.broadcast(buffer.data(), bytes->size(), 0);
      device.download(bytes->data(), buffer.data(), bytes->size());
    }
    if (!root) {
      t.info.data = bytes->data();
      t.bytes = std::move(bytes);
    }
  }
}

WeightTransfer::WeightTransfer(Engine& engine, std::string backend)
    : engine_(engine), backend_(std::move(backend)) {
  CHECK(backend_.empty() || backend_ == "nccl" || backend_ == "gloo",
        "--weight-transfer-config: backend must be 'nccl' or 'gloo', got '", backend_, "'");
  const DeviceKind kind = engine_.model().backend().kind();
  CHECK(backend_.empty() || (backend_ == "nccl") == (kind == DeviceKind::kCuda),
        "--weight-transfer-config: backend '", backend_, "' does not fit the ",
        kind == DeviceKind::kCuda ? "CUDA" : "CPU", " backend (",
        kind == DeviceKind::kCuda ? "nccl" : "gloo", " does)");
}

WeightTransfer::~WeightTransfer() = default;

void WeightTransfer::init(const WeightTransferInit& init) {
  std::lock_guard lock(mu_);
  if (backend_.empty()) {
    throw InvalidRequest("init_info",
                         "no weight-transfer backend: start the server with "
                         "--weight-transfer-config '{\"backend\": \"gloo\"}' (or nccl on GPUs)");
  }
  if (init.world_size < 2 || init.rank_offset < 1 || init.rank_offset >= init.world_size) {
    throw InvalidRequest("init_info", "rank_offset " + std::to_string(init.rank_offset) +
                                          " and world_size " + std::to_string(init.world_size) +
                                          ": need 1 <= rank_offset < world_size");
  }
  if (init.master_port <= 0 || init.master_port > 65535) {
    throw InvalidRequest(
        "init_info", "master_port must be in [1, 65535], got " + std::to_string(init.master_port));
  }
  comm_.reset();
  store_.reset();
  const auto timeout = std::chrono::milliseconds(int64_t{init.timeout_s} * 1000);
  parallel::TcpStoreOptions so;
  so.host = init.master_address;
  so.port = init.master_port;
  so.is_server = false;
  so.connect_timeout = timeout;
  so.timeout = timeout;
  try {
    store_ = std::make_unique<parallel::TcpStore>(so);
    comm_ = parallel::make_backend_communicator(
        engine_.model().backend(), *store_, init.rank_offset, init.world_size, timeout, kPrefix);
  } catch (const Error& e) {
    comm_.reset();
    store_.reset();
    throw Error(std::string("weight transfer: joining the trainer's group at ") +
                init.master_address + ":" + std::to_string(init.master_port) +
                " failed: " + e.what());
  }
  world_size_ = init.world_size;
  timeout_ms_ = timeout.count();
  log::info("weight transfer: joined the trainer's group at {}:{} as rank {} of {} ({})",
            init.master_address, init.master_port, init.rank_offset, init.world_size, backend_);
}

void WeightTransfer::start() {
  std::lock_guard lock(mu_);
  staged_.clear();
  started_ = true;
}

void WeightTransfer::stage(TensorInfo info, std::shared_ptr<const std::vector<uint8_t>> bytes) {
  info.data = bytes->data();
  std::erase_if(staged_, [&](const OverrideTensor& o) { return o.info.name == info.name; });
  staged_.push_back({std::move(info), std::move(bytes)});
}

void WeightTransfer::update(const WeightTransferUpdate& u) {
  std::lock_guard lock(mu_);
  if (!started_)
    throw InvalidRequest("", "no weight update in progress: call /start_weight_update");
  if (!u.weights_path.empty()) {
    if (!u.names.empty()) {
      throw InvalidRequest("update_info", "give either weights_path or names, not both");
    }
    const Checkpoint folder = Checkpoint::open(u.weights_path);
    for (const std::string& name : folder.names()) {
      const TensorInfo& t = *folder.find(name);
      auto bytes = std::make_shared<const std::vector<uint8_t>>(t.data, t.data + t.num_bytes);
      TensorInfo info = t;
      info.file = "weight update from " + u.weights_path;
      stage(std::move(info), std::move(bytes));
    }
    return;
  }
  if (u.names.size() != u.dtype_names.size() || u.names.size() != u.shapes.size()) {
    throw InvalidRequest("update_info", "names, dtype_names and shapes must have one entry each: " +
                                            std::to_string(u.names.size()) + ", " +
                                            std::to_string(u.dtype_names.size()) + ", " +
                                            std::to_string(u.shapes.size()));
  }
  if (comm_ == nullptr) {
    throw InvalidRequest("",
                         "the trainer's group is not joined: call /init_weight_transfer_engine");
  }
  // Every entry is checked before the first receive: the trainer sends them all regardless.
  std::vector<OverrideTensor> tensors;
  for (size_t i = 0; i < u.names.size(); ++i) {
    tensors.push_back(incoming_tensor(u.names[i], parse_transfer_dtype(u.dtype_names[i]),
                                      u.shapes[i], "the trainer (broadcast)"));
  }
  parallel::Communicator& comm = *comm_;
  engine_.run_between_steps(
      [&](const Model& model) { relay_tensors(comm, model.backend(), tensors, /*root=*/false); });
  for (OverrideTensor& t : tensors) stage(std::move(t.info), std::move(t.bytes));
}

int64_t WeightTransfer::finish() {
  std::lock_guard lock(mu_);
  if (!started_)
    throw InvalidRequest("", "no weight update in progress: call /start_weight_update");
  started_ = false;
  std::vector<OverrideTensor> staged = std::move(staged_);
  staged_.clear();
  const auto n = static_cast<int64_t>(staged.size());
  if (n == 0) return 0;
  engine_.update_weights(updated_checkpoint(engine_.model().weights_source(), std::move(staged)));
  return n;
}

void WeightTransfer::shutdown() {
  std::lock_guard lock(mu_);
  comm_.reset();
  store_.reset();
  world_size_ = 1;
}

bool WeightTransfer::initialized() const {
  std::lock_guard lock(mu_);
  return comm_ != nullptr;
}

int WeightTransfer::world_size() const {
  std::lock_guard lock(mu_);
  return world_size_;
}

}  // namespace hyserve
