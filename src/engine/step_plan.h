// StepPlan: what a tensor-parallel worker needs of one step, sent by rank 0 (the leader,
// which schedules, samples and serves) to every other rank before rank 0 runs the step
// itself. vLLM's SchedulerOutput broadcast, cut down to the forward: workers keep no
// request state but each request's block table (kept between steps, so a step carries the
// entries that changed), never sample, and read the placeholder of a token the step before
// sampled from the sampled ids rank 0 broadcasts over the communicator at the end of every
// step that samples (ModelRunner).
//
// A worker runs, in order: the commit of the last verification (speculative decoding);
// forget the dropped tables; the KDA state rows (zero, or copy a
// prefix hit's snapshot); each part's forward (one, or two in batch-invariant mixed steps)
// on the decode step or Model::forward_logits, as rank 0 chose; the snapshot copies; then
// joins the broadcast of num_sampled ids. Every rank thereby issues the same collectives
// in the same order.
//
// Wire format (encode_plan / decode_plan): little-endian integers, strings and arrays
// prefixed by a u32 count; decode_plan checks every length against what is left and
// throws Error naming the field on a malformed plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyserve {

struct PlanSequence {
  std::string request_id;
  int64_t num_computed = 0;
  int32_t state_block = -1;
  bool all_logits = false;
  bool prefill = false;
  std::vector<int32_t> tokens;  // the last may be a placeholder, see source_row
  // >= 0: the last token is row source_row of the previous step's sampled ids.
  int32_t source_row = -1;
  std::vector<int64_t> slots;
  // The block table: its first blocks_kept entries as last sent, then new_blocks.
  int64_t blocks_kept = 0;
  std::vector<int32_t> new_blocks;
  int32_t lora_slot = -1;  // its LoRA adapter's slot (-1: none)
};

struct PlanPart {
  bool decode_step = false;  // rank 0 ran it on the decode step (DecodeStep::accepts)
  bool verify = false;       // as a verification (DecodeStep::verify)
  std::vector<PlanSequence> sequences;
};

struct PlanStateOp {
  int32_t state_block = 0;
  int32_t source_block = -1;  // -1: zero the row, else copy that snapshot row into it
};

struct PlanSnapshot {
  int32_t state_block = 0;
  int32_t snapshot_block = 0;
};

// A generation control (engine/engine_control.cpp) each worker runs instead of a step.
enum class PlanControl : uint8_t {
  kNone,
  kSleep,          // control_arg 1 or 2: free the cache (and the weights: level 2, or kept on
                   // the host: level 1)
  kWakeUp,         // control_arg bit 0: the weights, bit 1: the cache
  kUpdateWeights,  // weights_dir with `tensors` in place; rank 0 broadcasts each tensor's
                   // bytes over the group's communicator after this plan, in this order
  kSetLora,        // LoRA slot control_arg gets the adapter lora_name (none: emptied) whose
                   // whole pairs are `tensors` (<module>.lora_A [r, in], <module>.lora_B
                   // [out, r], fp32), relayed as kUpdateWeights' are; each rank keeps its share
};

struct PlanTensor {
  std::string name;
  uint8_t dtype = 0;  // DType
  std::vector<int64_t> shape;
};

struct StepPlan {
  uint64_t step = 0;  // 1, 2, ... (acknowledged by the workers)
  PlanControl control = PlanControl::kNone;
  int32_t control_arg = 0;
  std::string weights_dir;
  std::vector<PlanTensor> tensors;
  std::string lora_name;  // kSetLora: the adapter, its rank and scale (empty: none)
  int64_t lora_rank = 0;
  float lora_scale = 0.0f;
  bool stop = false;  // the leader is shutting down: the worker exits
  // The commit counts of the last verification before this step (DecodeStep::commit), run
  // first; empty: none.
  std::vector<int32_t> commits;
  std::vector<std::string> dropped;  // requests whose tables the workers forget
  std::vector<PlanStateOp> state_ops;
  std::vector<PlanPart> parts;
  std::vector<PlanSnapshot> snapshots;
  int32_t num_sampled = 0;  // sampled ids rank 0 broadcasts after the step
};

std::vector<uint8_t> encode_plan(const StepPlan& plan);
StepPlan decode_plan(const std::vector<uint8_t>& bytes);

// Receives each step's plan on rank 0 (the leader's link to its workers), before rank 0
// runs the step. Throws when a worker has failed (the step is not run).
class PlanSink {
 public:
  virtual ~PlanSink() = default;
  virtual void send(const StepPlan& plan) = 0;
};

}  // namespace hyserve
