// Model's weight updates and sleep mode (issue 48): new values written over the running
// weights (reload_weights), and the weights' backend memory freed and brought back
// (release_weights / restore_weights). docs/DECISIONS.md "Weight updates and sleep mode".
#include <cstring>
#include <vector>

#include "model/model.h"
#include "model/tensor_parallel.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve {

namespace {

// The non-empty tensors of a ModelWeights, in for_each_tensor's order.
struct TensorRefs {
  std::vector<Weight*> weights;
  std::vector<Vec*> vecs;
};

TensorRefs refs_of(ModelWeights& w) {
  TensorRefs r;
  for_each_tensor(
      w, [&](Weight& x) { r.weights.push_back(&x); }, [&](Vec& v) { r.vecs.push_back(&v); });
  return r;
}

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kDense:
      return "dense";
    case WeightFormat::kFp8Block:
      return "fp8-block";
    case WeightFormat::kMxfp4:
      return "mxfp4";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

}  // namespace

void Model::place_weights(std::vector<std::vector<uint8_t>>* backup) {
  if (backend_->kind() == DeviceKind::kCpu) return;
  weight_buffers_.clear();
  size_t next = 0;
  // One buffer per tensor (and per scale tensor), in for_each_tensor's order: the order
  // release_weights downloads them in.
  auto place = [&](const void* host, size_t bytes) {
    DeviceAllocation data(backend_.get(), bytes);
    if (backup != nullptr) {
      CHECK(next < backup->size() && (*backup)[next].size() == bytes,
            "weights: the host copy does not match buffer ", next);
      backend_->upload(data.data(), (*backup)[next].data(), bytes);
    } else {
      backend_->upload(data.data(), host, bytes);
    }
    ++next;
    void* p = data.data();
    weight_buffers_.push_back(std::move(data));
    return p;
  };
  for_each_tensor(
      weights_,
      [&](Weight& w) {
        w.data = place(w.data, static_cast<size_t>(w.data_bytes()));
        if (const auto sb = static_cast<size_t>(w.scale_bytes())) w.scales = place(w.scales, sb);
      },
      [&](Vec& v) {
        v.data = static_cast<const float*>(place(v.data, static_cast<size_t>(v.size) * 4));
      });
  if (config_.tie_word_embeddings) weights_.lm_head = weights_.embed;
  backend_->synchronize();
}

LoadedWeights Model::load_rank_weights(const TensorSource& source) const {
  const TensorParallel& tp = options_.parallel.tp;
  LoadedWeights w = load_weights(full_config_, source);
  shard_weights(full_config_, tp.rank, tp.size, w, kv_b_ranks(), options_.parallel.expert_parallel);
  return w;
}

void Model::adopt_views(ModelWeights& next) {
  const TensorRefs now = refs_of(weights_);
  const TensorRefs from = refs_of(next);
  CHECK(now.weights.size() == from.weights.size() && now.vecs.size() == from.vecs.size(),
        "weights: ", from.weights.size(), " matrices and ", from.vecs.size(),
        " vectors where the model runs ", now.weights.size(), " and ", now.vecs.size());
  for (size_t i = 0; i < now.weights.size(); ++i) *now.weights[i] = *from.weights[i];
  for (size_t i = 0; i < now.vecs.size(); ++i) *now.vecs[i] = *from.vecs[i];
  if (config_.tie_word_embeddings) weights_.lm_head = weights_.embed;
}

void Model::refresh_lora() {
  if (lora_ == nullptr) return;
  for (int64_t s = 0; s < lora_->num_slots(); ++s) {
    std::shared_ptr<const LoraAdapter> a = lora_->adapter(s);
    if (a == nullptr) continue;
    lora_->set(s, nullptr);
    lora_->set(s, std::move(a));
  }
}

void Model::reload_weights(std::unique_ptr<TensorSource> source) {
  CHECK(source != nullptr, "reload_weights: no source");
  CHECK(weights_resident_, "reload_weights: the weights are released (sleep); wake them first");
  // Every tensor is found and checked before anything changes.
  LoadedWeights fresh = load_rank_weights(*source);
  const TensorRefs now = refs_of(weights_);
  const TensorRefs next = refs_of(fresh.views);
  CHECK(now.weights.size() == next.weights.size() && now.vecs.size() == next.vecs.size(),
        "weight update from ", source->dir().string(), ": ", next.weights.size(), " matrices and ",
        next.vecs.size(), " vectors where the model runs ", now.weights.size(), " and ",
        now.vecs.size());
  for (size_t i = 0; i < now.weights.size(); ++i) {
    const Weight& a = *now.weights[i];
    const Weight& b = *next.weights[i];
    CHECK(a.format == b.format && a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols &&
              a.scales_dtype == b.scales_dtype,
          "weight update from ", source->dir().string(), ": matrix ", i, " is ",
          format_name(b.format), " ", dtype_name(b.dtype), " [", b.rows, ", ", b.cols,
          "] where the model runs ", format_name(a.format), " ", dtype_name(a.dtype), " [", a.rows,
          ", ", a.cols, "]: an update keeps each tensor's format");
  }
  if (backend_->kind() == DeviceKind::kCpu) {
    adopt_views(fresh.views);
  } else {
    // New values over the old, at the same addresses.
    for (size_t i = 0; i < now.weights.size(); ++i) {
      const Weight& b = *next.weights[i];
      backend_->upload(const_cast<void*>(now.weights[i]->data), b.data,
                       static_cast<size_t>(b.data_bytes()));
      if (const auto sb = static_cast<size_t>(b.scale_bytes()))
        backend_->upload(const_cast<void*>(now.weights[i]->scales), b.scales, sb);
    }
    for (size_t i = 0; i < now.vecs.size(); ++i) {
      backend_->upload(const_cast<float*>(now.vecs[i]->data), next.vecs[i]->data,
                       static_cast<size_t>(next.vecs[i]->size) * 4);
    }
    backend_->synchronize();
  }
  host_weights_ = std::move(fresh);
  source_ = std::move(source);
  refresh_lora();
}

void Model::release_weights(bool keep_host_copy) {
  if (!weights_resident_) return;
  if (backend_->kind() == DeviceKind::kCpu) {
    if (keep_host_copy) return;  // host memory is where a copy would go
    host_weights_.owned.clear();
    host_weights_.owned_bytes.clear();
  } else {
    weights_backup_.clear();
    if (keep_host_copy) {
      weights_backup_.reserve(weight_buffers_.size());
      for (const DeviceAllocation& b : weight_buffers_) {
        std::vector<uint8_t> host(b.size());
        backend_->download(host.data(), b.data(), b.size());
        weights_backup_.push_back(std::move(host));
      }
    }
    weight_buffers_.clear();
  }
  weights_resident_ = false;
}

void Model::restore_weights() {
  if (weights_resident_) return;
  // Level 1 on a GPU: the host copy; otherwise (level 2, or the CPU's level 2) the source is
  // read again (views of the checkpoint's mmap and fresh copies).
  const bool from_backup = !weights_backup_.empty();
  if (!from_backup) {
    LoadedWeights fresh = load_rank_weights(*source_);
    adopt_views(fresh.views);
    host_weights_ = std::move(fresh);
  }
  if (backend_->kind() != DeviceKind::kCpu) {
    place_weights(from_backup ? &weights_backup_ : nullptr);
    weights_backup_.clear();
    weights_backup_.shrink_to_fit();
    backend_->weights_moved();
  }
  weights_resident_ = true;
  refresh_lora();
}

}  // namespace hyserve
