// The bundled model on the GPU (and random_prompt.h), shared by the GPU engine tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "model/model.h"
#include "random_prompt.h"

namespace hyserve::test {

inline std::unique_ptr<Model> load_tiny_on_gpu() {
  return Model::load(std::filesystem::path(HYSERVE_SOURCE_DIR) / "models/tiny-kimi-k3", {},
                     make_cuda_backend(0));
}

}  // namespace hyserve::test
