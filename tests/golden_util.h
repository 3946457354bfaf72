// Reading the golden fixtures (tools/make_fixtures.py) and comparing logits, shared by
// the CPU golden test and its GPU twin.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "model/safetensors.h"

namespace hyserve::test {

struct GoldenFixture {
  const char* name;
  const char* model_dir;   // relative to the source tree
  const char* golden_dir;  // holds golden.safetensors
};

inline const GoldenFixture kGoldenFixtures[] = {
    {"kimi_k3", "models/tiny-kimi-k3", "tests/fixtures/kimi_k3_tiny"},
    {"kimi_linear", "tests/fixtures/kimi_linear_tiny", "tests/fixtures/kimi_linear_tiny"},
    {"deepseek_v32", "tests/fixtures/deepseek_v32_tiny", "tests/fixtures/deepseek_v32_tiny"},
    {"deepseek_v32_fp8", "tests/fixtures/deepseek_v32_fp8_tiny",
     "tests/fixtures/deepseek_v32_fp8_tiny"},
    {"kimi_k3_published", "tests/fixtures/kimi_k3_published_tiny",
     "tests/fixtures/kimi_k3_published_tiny"},
    {"tiny_k3_speaks", "models/tiny-k3-speaks", "tests/fixtures/tiny_k3_speaks"},
};

inline std::vector<float> golden_floats(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) throw std::runtime_error("golden tensor missing: " + name);
  std::vector<float> out(static_cast<size_t>(t->num_elements()));
  convert_to_f32(t->data, t->dtype, out.data(), t->num_elements());
  return out;
}

inline std::vector<int32_t> golden_ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) throw std::runtime_error("golden tensor missing: " + name);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t->num_elements(); ++i)
    out.push_back(static_cast<int32_t>(load_as_f32(t->data, t->dtype, i)));
  return out;
}

// |ours - ref| <= abs_tol + rel_tol * max|ref| over [rows, vocab]; names the worst element.
inline void expect_logits_close(const std::vector<float>& ours, const float* ref, int64_t rows,
                                int64_t vocab, float abs_tol, float rel_tol,
                                const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), rows * vocab) << what;
  float max_ref = 0.0f;
  for (int64_t i = 0; i < rows * vocab; ++i) max_ref = std::max(max_ref, std::fabs(ref[i]));
  const float tol = abs_tol + rel_tol * max_ref;
  float worst = -1.0f;
  int64_t at = 0;
  for (int64_t i = 0; i < rows * vocab; ++i) {
    const float err = std::fabs(ours[i] - ref[i]);
    if (!(err <= worst) || std::isnan(err)) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst |diff| " << worst << " at row " << at / vocab
                        << " token " << at % vocab << " (ours " << ours[at] << ", ref " << ref[at]
                        << "), tolerance " << tol;
}

inline float top2_gap(const float* row, int64_t vocab) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

}  // namespace hyserve::test
