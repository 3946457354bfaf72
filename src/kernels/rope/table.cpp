// RopeTable construction, in the float32 arithmetic of transformers' rope init
// (_compute_default_rope_parameters / _compute_yarn_parameters), so the frequencies
// agree with it to the last ulp or two (pow may differ by one ulp between libms).
#include <algorithm>
#include <cmath>

#include "kernels/rope/params.h"
#include "util/error.h"

namespace hyserve {
namespace {

constexpr double kPi = 3.14159265358979323846;

void check_dim(int64_t rotary_dim, double theta) {
  CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim must be positive and even, got ",
        rotary_dim);
  CHECK(theta > 0.0, "rope theta must be positive, got ", theta);
}

// theta^(2i / dim) in float32, as torch computes `base ** (arange(0, dim, 2).float() / dim)`.
float pos_freq(int64_t i, int64_t rotary_dim, double theta) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
  return std::pow(static_cast<float>(theta), exponent);
}

// The (fractional) pair dimension whose wavelength fits num_rotations times into
// max_positions.
double correction_dim(double num_rotations, int64_t rotary_dim, double theta,
                      int64_t max_positions) {
  return static_cast<double>(rotary_dim) *
         std::log(static_cast<double>(max_positions) / (num_rotations * 2.0 * kPi)) /
         (2.0 * std::log(theta));
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

RopeTable RopeTable::plain(int64_t rotary_dim, double theta) {
  check_dim(rotary_dim, theta);
  RopeTable t;
  t.rotary_dim = rotary_dim;
  t.inv_freq.resize(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    t.inv_freq[static_cast<size_t>(i)] = 1.0f / pos_freq(i, rotary_dim, theta);
  }
  return t;
}

RopeTable RopeTable::yarn(int64_t rotary_dim, double theta, const YarnParams& yarn) {
  check_dim(rotary_dim, theta);
  CHECK(yarn.factor > 0.0, "yarn factor must be positive, got ", yarn.factor);
  CHECK(yarn.original_max_position_embeddings > 0,
        "yarn original_max_position_embeddings must be positive, got ",
        yarn.original_max_position_embeddings);
  CHECK(yarn.beta_fast > 0.0 && yarn.beta_slow > 0.0,
        "yarn beta_fast / beta_slow must be positive");

  RopeTable t;
  t.rotary_dim = rotary_dim;
  if (yarn.attention_factor != 0.0) {
    t.attention_factor = static_cast<float>(yarn.attention_factor);
  } else if (yarn.mscale != 0.0 && yarn.mscale_all_dim != 0.0) {
    t.attention_factor = static_cast<float>(yarn_get_mscale(yarn.factor, yarn.mscale) /
                                            yarn_get_mscale(yarn.factor, yarn.mscale_all_dim));
  } else {
    t.attention_factor = static_cast<float>(yarn_get_mscale(yarn.factor, 1.0));
  }
  if (yarn.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(yarn.factor, yarn.mscale_all_dim);
    t.softmax_scale_factor = m * m;
  }

  const int64_t orig = yarn.original_max_position_embeddings;
  double low = correction_dim(yarn.beta_fast, rotary_dim, theta, orig);
  double high = correction_dim(yarn.beta_slow, rotary_dim, theta, orig);
  if (yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rotary_dim - 1));
  if (low == high) high += 0.001;
  const float ramp_width = static_cast<float>(high - low);

  const float factor = static_cast<float>(yarn.factor);
  t.inv_freq.resize(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float pf = pos_freq(i, rotary_dim, theta);
    const float extrapolation = 1.0f / pf;
    const float interpolation = 1.0f / (factor * pf);
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) / ramp_width, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    t.inv_freq[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return t;
}

}  // namespace hyserve
