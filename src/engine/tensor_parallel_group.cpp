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
  }
}

}  // namespace

void run_tensor_parallel_worker(Model& model, const EngineConfig& config,
                                parallel::WorkerChannel& channel) {
  const int rank = model.options().parallel.tp.rank;
  try {
    const std::unique_ptr<KvCache> cache =
        model.new_cache(config.num_blocks, config.min_block_size);
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
