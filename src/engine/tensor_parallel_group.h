// The engine's side of a tensor-parallel group (DESIGN.md "Parallelism"): rank 0 runs the
// Engine (scheduler, sampling, the server) and sends each step's plan to the other ranks
// over the step channel (parallel/step_channel.h); each other rank runs its shard of the
// model on the plans it receives (ModelRunner::run_plan) and joins the collectives in the
// same order. One process per rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "engine/step_plan.h"
#include "model/lora_adapter.h"
#include "parallel/step_channel.h"

namespace hyserve {

class ModelRunner;

// Rank 0's PlanSink: plans to every worker, and what went wrong with them.
class LeaderLink : public PlanSink {
 public:
  explicit LeaderLink(parallel::LeaderChannel& channel) : channel_(channel) {}
  // Throws CommError with the failure of a worker already known (the step is not run).
  void send(const StepPlan& plan) override;
  // Tells the workers to exit (best effort).
  void stop() noexcept;
  uint64_t last_step() const { return last_step_; }
  // Why the group failed: a worker's own report ("rank R: ..."), else the ranks that have
  // not finished the last plan within `grace` (a hung worker), else none.
  std::optional<std::string> diagnose(std::chrono::milliseconds grace) const;

 private:
  parallel::LeaderChannel& channel_;
  uint64_t last_step_ = 0;
};

// Rank 0, between steps: LoRA slot `slot` of the workers' models gets `adapter` (null: the
// slot emptied), as rank 0's has: a kSetLora control plan, then the whole adapter's pairs
// relayed over the group's communicator; each worker keeps its share (Model::share_lora).
// Relayed rather than read by each rank from the adapter's folder, so that a folder rewritten
// in between (an adapter replaced in place) cannot give the ranks different adapters.
void send_lora_to_workers(const Model& model, ModelRunner& runner, int32_t slot,
                          const std::shared_ptr<const LoraAdapter>& adapter);

// Rank > 0: runs plans until the leader says stop (returns) or closes the connection
// (returns too: the leader exited). Control plans (sleep, wake-up, weight updates, LoRA slots)
// change the rank's model and cache as rank 0's engine changed its own. An error in a step is
// reported to the leader, then rethrown. `config` as the leader's engine has it
// (complete_engine_config, the group's num_blocks).
void run_tensor_parallel_worker(Model& model, const EngineConfig& config,
                                parallel::WorkerChannel& channel);

}  // namespace hyserve
