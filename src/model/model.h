// Model: a loaded checkpoint and the decoder forward pass (MODEL.md §0-§5), written
// once as the flat sequence of layer calls the math is, against a Backend (the CPU
// reference ops or the CUDA kernels). No device code lives here.
//
// forward() takes a batch of sequences, each with its own new tokens (a prefill
// chunk or one decode token): projections, norms and MLPs run over all tokens of
// the batch at once; attention runs per sequence over its own cache.
//
// Per-request state lives in SequenceState, a simple per-request cache in backend
// memory: the MLA latent and index keys of every past token in each full-attention
// layer, the conv + recurrent state of each KDA layer. (The packed block cache
// replaces it in the engine.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "model/backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace hyserve {

struct ModelOptions {
  // DSA indexer scores on FP8 index keys with the Hadamard rotation (the cache
  // format of the GPU path). Off: exact fp32 scores, as the golden references use.
  bool indexer_fp8 = false;
};

struct SequenceState {
  struct Kda {
    BackendBuffer conv_q, conv_k, conv_v;  // [W-1, H*K] each, oldest first
    BackendBuffer recurrent;               // [H, K, K] fp32
  };
  struct Mla {
    BackendBuffer latent;            // [capacity, kv_lora + dr]: c (normalized) | k_pe (roped)
    BackendBuffer index_keys;        // [capacity, di] fp32 path
    BackendBuffer index_keys_fp8;    // [capacity, di] e4m3, FP8 path (after Hadamard)
    BackendBuffer index_key_scales;  // [capacity] fp32, FP8 path
  };
  int64_t num_tokens = 0;  // tokens already processed (the next position)
  int64_t capacity = 0;    // tokens the MLA caches can hold
  std::vector<Kda> kda;    // [num_layers], used by KDA layers
  std::vector<Mla> mla;    // [num_layers], used by full-attention layers
};

// One sequence's part of a batch.
struct SequenceInput {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;  // new tokens, after state->num_tokens past ones
  bool all_logits = false;          // logits of every new position, else of the last
};

// Receives named intermediates ("layers.3.attn_out", shape [rows, cols]) when set.
using DumpFn =
    std::function<void(std::string_view name, const float* data, int64_t rows, int64_t cols)>;

class Model {
 public:
  // Reads config.json and the safetensors of a checkpoint folder (every tensor is
  // checked before this returns) and places the weights on the backend (the CPU
  // when none is given; the model then owns it).
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, ModelOptions options = {},
                                     std::unique_ptr<Backend> backend = nullptr);
  // A model whose tensors come from any source (e.g. RandomWeights for benchmarks).
  static std::unique_ptr<Model> create(ModelConfig config, std::unique_ptr<TensorSource> source,
                                       ModelOptions options = {},
                                       std::unique_ptr<Backend> backend = nullptr);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  Backend& backend() const { return *backend_; }

  // A fresh request state with room for `capacity` tokens (grown on demand).
  SequenceState new_sequence(int64_t capacity = 0) const;
  // Makes room for `tokens` tokens in the state's caches (keeps their contents).
  void reserve(SequenceState& state, int64_t tokens) const;

  // Runs each input's tokens after its state's past tokens and advances the states.
  // logits gets the rows of every input in order: all its positions or its last
  // one, [rows, vocab].
  void forward(std::span<const SequenceInput> batch, std::vector<float>& logits) const;
  // One sequence.
  void forward(std::span<const int32_t> tokens, SequenceState& state, std::vector<float>& logits,
               bool all_positions = false) const;

  // Scratch memory of the forward pass (the CUDA runner freezes it after warm-up).
  Workspace& workspace() const { return workspace_; }

  void set_dump(DumpFn fn) { dump_ = std::move(fn); }
  // Called with the name of each section as it starts ("embed", "layers.3.attention",
  // "layers.3.mlp", "lm_head"): profilers attribute the ops that follow to it.
  void set_trace(std::function<void(std::string_view section)> fn) { trace_ = std::move(fn); }

 private:
  Model(ModelConfig config, std::unique_ptr<TensorSource> source, ModelOptions options,
        std::unique_ptr<Backend> backend);

  // One sequence's tokens within the batch: rows [offset, offset + n) of every
  // [T, ...] activation; positions start at state->num_tokens.
  struct Slice {
    int64_t offset;
    int64_t n;
    SequenceState* state;
  };

  // Attention of one layer over the whole batch: x = rms(h) [T, D] -> out [T, D].
  // Projections, norms and gates run over all T tokens at once; only what reads or
  // writes a sequence's own state (conv, recurrence, cache writes, attention) runs
  // per sequence. pos: [T] positions of the tokens.
  void mla_attention(int64_t layer, const float* x, int64_t num_tokens, const int64_t* pos,
                     std::span<const Slice> seqs, float* out) const;
  void kda_attention(int64_t layer, const float* x, int64_t num_tokens, std::span<const Slice> seqs,
                     float* out) const;
  // Over all tokens of the batch.
  void feed_forward(int64_t layer, const float* x, int64_t num_tokens, float* out) const;
  // DSA indexer: the selected past positions [T, index_topk] (-1 padded) of every
  // token. q_in is the normalized q latent [T, q_lora] (or x when q_lora_rank is 0).
  int32_t* index_select(int64_t layer, const float* x, const float* q_in, int64_t num_tokens,
                        const int64_t* pos, std::span<const Slice> seqs) const;
  float* linear(const float* x, int64_t num_tokens, const Weight& w) const;
  void linear_into(const float* x, int64_t num_tokens, const Weight& w, float* y) const;
  void rms_norm(const float* x, const Vec& w, int64_t rows, int64_t dim, double eps,
                float* y) const;
  void dump(std::string_view name, const float* data, int64_t rows, int64_t cols) const;
  void trace(std::string_view section) const {
    if (trace_) trace_(section);
  }

  ModelConfig config_;
  std::unique_ptr<TensorSource> source_;  // keeps the host tensors (mmaps) alive
  ModelOptions options_;
  std::unique_ptr<Backend> backend_;
  LoadedWeights host_weights_;
  ModelWeights weights_;                       // views in backend memory
  std::vector<BackendBuffer> weight_buffers_;  // backend copies (non-CPU backends)
  RopeTable rope_;  // deepseek_v32's (YaRN) rotary table; unused for NoPE
  mutable Workspace workspace_;
  DumpFn dump_;
  std::function<void(std::string_view)> trace_;
};

}  // namespace hyserve
