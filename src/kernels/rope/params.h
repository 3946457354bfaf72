// Rotary position embedding (MODEL.md §2.3, §3.2): the frequency table (plain RoPE or
// YaRN, computed as transformers' rope init computes it) and the parameters of the
// in-place rotation. deepseek_v32 rotates MLA's q_pe / k_pe with interleaved pairs and
// the indexer's first dims with half-split (NeoX) pairs; both read one RopeTable.
//
// What transformers (deepseek_v32, modeling_rope_utils) does with YaRN, and so what
// this table reproduces:
//   - cos and sin are multiplied by `attention_factor`: the explicit rope_parameters
//     value if given, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
//     when both mscale and mscale_all_dim are set (1.0 for DeepSeek's configs, where the
//     two are equal), else get_mscale(factor). It scales q_pe.k_pe by its square.
//   - separately, MLA's softmax scale (dn+dr)^-0.5 is multiplied by
//     get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set (yarn_apply_mscale).
//   get_mscale(f, m) = 0.1 * m * ln(f) + 1 for f > 1, else 1.
#pragma once

#include <cstdint>
#include <vector>

namespace hyserve {

// rope_parameters of a YaRN config. Zero means "absent" for the optional fields.
struct YarnParams {
  double factor = 1.0;                           // context extension ratio
  int64_t original_max_position_embeddings = 0;  // pretraining context
  double beta_fast = 32.0;                       // rotations where extrapolation ends
  double beta_slow = 1.0;                        // rotations where interpolation starts
  double mscale = 0.0;                           // optional
  double mscale_all_dim = 0.0;                   // optional
  double attention_factor = 0.0;                 // optional explicit cos/sin factor
  bool truncate = true;                          // floor/ceil the correction range
};

// get_mscale(scale, mscale): 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

struct RopeTable {
  int64_t rotary_dim = 0;             // even; rotated dims per head
  std::vector<float> inv_freq;        // [rotary_dim / 2] angle of pair i = pos * inv_freq[i]
  float attention_factor = 1.0f;      // multiplies cos and sin
  double softmax_scale_factor = 1.0;  // multiplies MLA's (dn+dr)^-0.5 (mscale_all_dim^2)

  // inv_freq[i] = 1 / theta^(2i / rotary_dim).
  static RopeTable plain(int64_t rotary_dim, double theta);
  // YaRN: blend of the interpolated (inv_freq / factor) and extrapolated frequencies,
  // with a linear ramp over the correction range found from beta_fast / beta_slow.
  static RopeTable yarn(int64_t rotary_dim, double theta, const YarnParams& yarn);
};

// In-place rotation of dims [offset, offset + rotary_dim) of every head of every token,
// by the angle of that token's position.
struct RopeParams {
  float* x = nullptr;                  // [T, num_heads, head_stride]
  const int64_t* positions = nullptr;  // [T]
  int64_t num_tokens = 0;              // T >= 0
  int64_t num_heads = 0;               // heads per token (1 for a shared key)
  int64_t head_stride = 0;             // floats per head
  int64_t offset = 0;                  // first rotated dim within a head
};

// The backend's rope op: RopeParams rotated with a table's angles, in one of two pairings.
struct RopeOpParams {
  const RopeTable* table = nullptr;  // host table; a device backend keeps its copy per table
  RopeParams rope;
  bool neox = false;  // half-split (NeoX) pairs (the indexer), else interleaved pairs (MLA)
};

}  // namespace hyserve
