// WeightTransfer: the serving side of vLLM's weight-transfer protocol, by which an RL trainer
// pushes new weights into a running server (issue 48 item 4; docs/DECISIONS.md "Weight
// updates and sleep mode"):
//
//   init     join the trainer's group: the trainer (rank 0) serves the rendezvous store at
//            master_address:master_port, this server is rank rank_offset of world_size; the
//            communicator is the backend's (NCCL on CUDA, Gloo on the CPU)
//   start    a new update: nothing staged
//   update   named tensors (names, dtype_names, shapes), each broadcast by rank 0 in that
//            order; or every tensor of a safetensors folder (weights_path, no group needed)
//   finish   the staged tensors written over the running weights (Engine::update_weights:
//            all checked first; a name the model lacks, or another dtype or shape, is refused
//            naming it and nothing changes); tensors not sent keep their values
//
// Rank 0 alone joins the trainer's group; under tensor parallelism it relays the tensors to
// its workers over the group's own communicator (Engine::update_weights). Methods are called
// from one thread at a time (the server's control thread); receives run on the engine thread
// between steps, so generation pauses while tensors arrive.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/checkpoint.h"
#include "parallel/communicator.h"
#include "parallel/store.h"

namespace hyserve {

struct WeightTransferInit {
  std::string master_address = "127.0.0.1";
  int master_port = 0;
  int rank_offset = 1;  // this server's rank in the trainer's group
  int world_size = 2;   // the trainer's ranks and the servers'
  int timeout_s = 300;  // rendezvous and each collective
};

struct WeightTransferUpdate {
  std::vector<std::string> names;
  std::vector<std::string> dtype_names;  // torch's ("bfloat16") or safetensors' ("BF16")
  std::vector<std::vector<int64_t>> shapes;
  std::string weights_path;  // instead of the group: every tensor of this folder
};

// "bfloat16", "float32", "float16", "float8_e4m3fn", "uint8", "int32", ... or safetensors'
// names; InvalidRequest naming the field otherwise.
DType parse_transfer_dtype(const std::string& name);

// The model's checkpoint (current: the model's weights source, a Checkpoint) with `staged` in
// place of the folder's tensors; earlier updates' tensors carry over unless sent again.
// InvalidRequest when the model's weights did not come from a checkpoint folder.
std::unique_ptr<Checkpoint> updated_checkpoint(const TensorSource& current,
                                               std::vector<OverrideTensor> staged);

// A tensor about to arrive (relay_tensors fills its bytes): its info with num_bytes, named
// in messages as a weight update from `from`. InvalidRequest on a negative dimension.
OverrideTensor incoming_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                               const std::string& from);

// Rank 0 (root) sends each tensor's bytes over comm in order, the other ranks receive them
// into fresh buffers (their infos describe the tensors; data is set). On a device whose
// communicator takes device memory the bytes pass through a device buffer.
void relay_tensors(parallel::Communicator& comm, Device& device,
                   std::vector<OverrideTensor>& tensors, bool root);

class WeightTransfer {
 public:
  // backend: the one --weight-transfer-config names ("nccl" or "gloo"; "" allows only
  // weights_path updates). It must be the engine's device's: nccl on CUDA, gloo on the CPU.
  WeightTransfer(Engine& engine, std::string backend);
  ~WeightTransfer();

  void init(const WeightTransferInit& init);
  void start();
  void update(const WeightTransferUpdate& update);
  // Returns the number of tensors applied.
  int64_t finish();
  // Leaves the trainer's group (a later init joins again).
  void shutdown();
  bool initialized() const;
  int world_size() const;

 private:
  void stage(TensorInfo info, std::shared_ptr<const std::vector<uint8_t>> bytes);

  Engine& engine_;
  std::string backend_;
  mutable std::mutex mu_;
  std::unique_ptr<parallel::TcpStore> store_;
  std::unique_ptr<parallel::Communicator> comm_;
  int world_size_ = 1;
  int64_t timeout_ms_ = 300000;
  bool started_ = false;
  std::vector<OverrideTensor> staged_;
};

}  // namespace hyserve
