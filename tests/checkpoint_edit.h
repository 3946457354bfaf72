// Tests of checkpoint loading: a checkpoint folder copied with edited tensors, and the
// error a load gives.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/safetensors.h"
#include "util/error.h"

namespace hyserve::test {

// Copies the checkpoint in `src_dir` (config.json, model.safetensors) into a temp folder
// named after `name` and this process (ctest runs tests in parallel processes: one rewriting a
// file another has mapped would fault it), letting `edit` change its tensors first.
inline std::filesystem::path rewrite_checkpoint(
    const std::filesystem::path& src_dir, const std::string& name,
    const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(testing::TempDir()) / ("hyserve_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(src_dir / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::open(src_dir / "model.safetensors");
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : src.tensors()) {
    tensors.push_back(
        {t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)});
  }
  edit(tensors);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

// The CheckpointError text Model::load(dir) throws; empty when it loads.
inline std::string load_error(const std::filesystem::path& dir) {
  try {
    Model::load(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace hyserve::test
