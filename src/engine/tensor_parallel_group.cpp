#include "engine/tensor_parallel_group.h"

#include <exception>

#include "engine/model_runner.h"
#include "engine/weight_transfer.h"
#include "model/checkpoint.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve {

void LeaderLink::send(const StepPlan& plan) {
  channel_.send(encode_plan(plan));
  last_step_ = plan.step;
}

void LeaderLink::stop() noexcept {
  try {
    StepPlan plan;
    plan.step = last_step_ + 1;
    plan.stop = true;
    channel_.send(encode_plan(plan));
  } catch (const std::exception& e) {
    log::warn("tensor parallel: telling the workers to stop failed: {}", e.what());
  }
}

std::optional<std::string> LeaderLink::diagnose(std::chrono::milliseconds grace) const {
  if (auto f = channel_.failure()) return f;
  const std::vector<int> behind = channel_.wait_acked(last_step_, grace);
  if (auto f = channel_.failure()) return f;
  if (behind.empty()) return std::nullopt;
  std::string ranks;
  for (int r : behind) ranks += str_cat(ranks.empty() ? "" : ", ", r);
  return str_cat("rank(s) ", ranks, " did not finish step ", last_step_, " (hung or too slow)");
}

namespace {

std::string lora_tensor_name(const std::string& module, bool a) {
  return module + (a ? ".lora_A" : ".lora_B");
}

// A kSetLora plan's adapter on a worker: the whole adapter from the relayed tensors, this
// rank's share of it in the slot.
void set_relayed_lora(Model& model, const StepPlan& plan) {
  const int32_t slot = plan.control_arg;
  if (plan.lora_name.empty()) {
    model.set_lora(slot, nullptr);
    return;
  }
  CHECK(plan.tensors.size() % 2 == 0, "LoRA adapter ", plan.lora_name, ": ", plan.tensors.size(),
        " tensors, not A and B pairs");
  std::vector<OverrideTensor> tensors;
  for (const PlanTensor& t : plan.tensors) {
    CHECK(static_cast<DType>(t.dtype) == DType::kF32 && t.shape.size() == 2, "LoRA adapter ",
          plan.lora_name, ": tensor ", t.name, " is not a 2-D fp32 matrix");
    tensors.push_back(incoming_tensor(t.name, DType::kF32, t.shape, "rank 0"));
  }
  relay_tensors(*model.options().parallel.tp.comm, model.backend(), tensors, /*root=*/false);
  auto whole = std::make_shared<LoraAdapter>();
  whole->name = plan.lora_name;
  whole->rank = plan.lora_rank;
  for (size_t i = 0; i < tensors.size(); i += 2) {
    const std::string& a_name = tensors[i].info.name;
    const std::string module = a_name.substr(0, a_name.size() - std::string_view(".lora_A").size());
    CHECK(a_name == lora_tensor_name(module, true) &&
              tensors[i + 1].info.name == lora_tensor_name(module, false),
          "LoRA adapter ", plan.lora_name, ": tensors ", a_name, " and ", tensors[i + 1].info.name,
          " are not one module's A and B");
    LoraAdapter::Pair& p = whole->pairs.emplace_back();
    p.module = module;
    p.rank = plan.lora_rank;
    p.scale = plan.lora_scale;
    const auto values = [](const OverrideTensor& t) {
      const auto* f = reinterpret_cast<const float*>(t.info.data);
      return std::vector<float>(f, f + t.info.num_elements());
    };
    p.a = values(tensors[i]);
    p.b = values(tensors[i + 1]);
  }
  model.set_lora(slot, model.share_lora(std::move(whole)));
}

// A control plan (StepPlan::control): what rank 0's engine did between steps, on this rank.
void run_control_plan(Model& model, KvCache& cache, ModelRunner& runner, const StepPlan& plan) {
  const UnfrozenScope allocating(model.backend());
  switch (plan.control) {
    case PlanControl::kNone:
      break;
    case PlanControl::kSleep:
      runner.release_graphs();
      cache.release();
      model.release_weights(plan.control_arg == 1);
      break;
    case PlanControl::kWakeUp:
      if (plan.control_arg & 1) model.restore_weights();
      if (plan.control_arg & 2) cache.restore();
      runner.release_graphs();
      break;
    case PlanControl::kUpdateWeights: {
      std::vector<OverrideTensor> tensors;
      for (const PlanTensor& t : plan.tensors) {
        tensors.push_back(incoming_tensor(t.name, static_cast<DType>(t.dtype), t.shape, "rank 0"));
      }
      relay_tensors(*model.options().parallel.tp.comm, model.backend(), tensors,
                    /*root=*/false);
      model.reload_weights(std::make_unique<Checkpoint>(
          Checkpoint::open_with(plan.weights_dir, std::move(tensors))));
      break;
    }
    case PlanControl::kSetLora:
      set_relayed_lora(model, plan);
      break;
  }
}

}  // namespace

void send_lora_to_workers(const Model& model, ModelRunner& runner, int32_t slot,
                          const std::shared_ptr<const LoraAdapter>& adapter) {
  StepPlan plan;
  plan.control = PlanControl::kSetLora;
  plan.control_arg = slot;
  std::vector<OverrideTensor> tensors;
  if (adapter != nullptr) {
    const LoraAdapter& whole = adapter->whole != nullptr ? *adapter->whole : *adapter;
    plan.lora_name = whole.name.empty() ? std::string("adapter") : whole.name;
    plan.lora_rank = whole.rank;
    for (const LoraAdapter::Pair& p : whole.pairs) {
      CHECK(p.rank == whole.rank && (plan.tensors.empty() || p.scale == plan.lora_scale),
            "LoRA adapter ", whole.name, ": pairs of different ranks or scales");
      plan.lora_scale = p.scale;
      const int64_t in = static_cast<int64_t>(p.a.size()) / p.rank;
      const int64_t out = static_cast<int64_t>(p.b.size()) / p.rank;
      for (const bool is_a : {true, false}) {
        const std::vector<float>& v = is_a ? p.a : p.b;
        OverrideTensor t;
        t.info.name = lora_tensor_name(p.module, is_a);
        t.info.dtype = DType::kF32;
        t.info.shape = is_a ? std::vector<int64_t>{p.rank, in} : std::vector<int64_t>{out, p.rank};
        t.info.num_bytes = static_cast<int64_t>(v.size() * 4);
        t.info.data = reinterpret_cast<const uint8_t*>(v.data());
        plan.tensors.push_back({t.info.name, static_cast<uint8_t>(DType::kF32), t.info.shape});
        tensors.push_back(std::move(t));
      }
    }
  }
  runner.send_control(std::move(plan));
  const UnfrozenScope allocating(model.backend());
  relay_tensors(*model.options().parallel.tp.comm, model.backend(), tensors, /*root=*/true);
}

void run_tensor_parallel_worker(Model& model, const EngineConfig& config,
                                parallel::WorkerChannel& channel) {
  const int rank = model.options().parallel.tp.rank;
  try {
    const std::unique_ptr<KvCache> cache =
        model.new_cache(config.num_blocks, config.min_block_size);
    // The leader's LoRA slots (serve --enable-lora), filled by its kSetLora plans.
    if (config.scheduler.max_loras > 0 && !model.lora_enabled()) {
      model.enable_lora(config.scheduler.max_loras, config.max_lora_rank);
    }
    ModelRunnerConfig rc = runner_config(config);
    rc.samples = false;
    ModelRunner runner(model, *cache, rc);
    for (;;) {
      const std::optional<parallel::Bytes> bytes = channel.receive();
      if (!bytes) {
        log::info("rank {}: the leader closed the step channel; exiting", rank);
        break;
      }
      const StepPlan plan = decode_plan(*bytes);
      if (plan.stop) break;
      if (plan.control != PlanControl::kNone) {
        run_control_plan(model, *cache, runner, plan);
      } else {
        runner.run_plan(plan);
      }
      channel.ack(plan.step);
    }
    model.backend().synchronize();
  } catch (const std::exception& e) {
    channel.report_error(e.what());
    throw;
  }
}

}  // namespace hyserve
