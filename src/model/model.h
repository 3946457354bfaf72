// Model: a loaded checkpoint and the decoder forward pass on the CPU backend
// (MODEL.md §0-§5), written as the flat sequence of layer calls the math is.
//
// Per-request state lives in SequenceState, a simple per-request cache: the MLA
// latent and index keys of every past token in each full-attention layer, and the
// conv + recurrent state of each KDA layer. (The packed block cache replaces it
// in the engine.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/rope/params.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

namespace hyserve {

struct ModelOptions {
  // DSA indexer scores on FP8 index keys with the Hadamard rotation (the cache
  // format of the GPU path). Off: exact fp32 scores, as the golden references use.
  bool indexer_fp8 = false;
};

struct KdaLayerState {
  std::vector<float> conv_q, conv_k, conv_v;  // [W-1, H*K] each, oldest first
  std::vector<float> recurrent;               // [H, K, K]
};

struct MlaLayerCache {
  std::vector<float> latent;            // [S, kv_lora + dr]: c (normalized) | k_pe (roped)
  std::vector<float> index_keys;        // [S, di] fp32 path (after k_norm, rope)
  std::vector<uint8_t> index_keys_fp8;  // [S, di] e4m3, FP8 path (after Hadamard)
  std::vector<float> index_key_scales;  // [S] FP8 path
};

struct SequenceState {
  int64_t num_tokens = 0;          // tokens already processed (next position)
  std::vector<KdaLayerState> kda;  // [num_layers], used by KDA layers
  std::vector<MlaLayerCache> mla;  // [num_layers], used by full-attention layers
};

// Receives named intermediates ("layers.3.attn_out", shape [rows, cols]) when set.
using DumpFn =
    std::function<void(std::string_view name, const float* data, int64_t rows, int64_t cols)>;

class Model {
 public:
  // Reads config.json and the safetensors of a checkpoint folder; every tensor is
  // checked before this returns.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, ModelOptions options = {});

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  SequenceState new_sequence() const;

  // Runs `tokens` after the state's past tokens and advances the state. Writes the
  // logits of every new position into logits [T, V] when all_positions, else of the
  // last one [V].
  void forward(std::span<const int32_t> tokens, SequenceState& state, std::vector<float>& logits,
               bool all_positions = false) const;

  void set_dump(DumpFn fn) { dump_ = std::move(fn); }

 private:
  Model(ModelConfig config, Checkpoint checkpoint, ModelOptions options);

  // Each takes x = rms(h) [T, D] and writes the layer's output [T, D].
  void mla_attention(int64_t layer, const float* x, int64_t num_tokens, int64_t start_pos,
                     MlaLayerCache& cache, float* out) const;
  void kda_attention(int64_t layer, const float* x, int64_t num_tokens, KdaLayerState& state,
                     float* out) const;
  void feed_forward(int64_t layer, const float* x, int64_t num_tokens, float* out) const;
  // DSA indexer: scores the new tokens' queries against every cached index key and
  // returns the selected positions [T, index_topk] (-1 padded). q_in is the
  // normalized q latent [T, q_lora] (or x when q_lora_rank is 0).
  std::vector<int32_t> index_select(int64_t layer, const float* x, const float* q_in,
                                    int64_t num_tokens, int64_t start_pos,
                                    MlaLayerCache& cache) const;
  void dump(std::string_view name, const float* data, int64_t rows, int64_t cols) const;

  ModelConfig config_;
  Checkpoint checkpoint_;
  ModelOptions options_;
  ModelWeights weights_;
  RopeTable rope_;  // deepseek_v32's (YaRN) rotary table; unused for NoPE
  DumpFn dump_;
};

}  // namespace hyserve
