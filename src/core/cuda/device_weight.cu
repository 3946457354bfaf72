#include "core/cuda/device_weight.h"

#include "util/error.h"

namespace hyserve::cuda {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

int64_t weight_data_bytes(const Weight& w) {
  switch (w.format) {
    case WeightFormat::kDense:
      return w.rows * w.cols * dtype_size(w.dtype);
    case WeightFormat::kFp8Block:
      return w.rows * w.cols;
    case WeightFormat::kMxfp4:
    case WeightFormat::kInt4:
      return w.rows * w.cols / 2;
  }
  return 0;
}

int64_t weight_scales_bytes(const Weight& w) {
  switch (w.format) {
    case WeightFormat::kDense:
      return 0;
    case WeightFormat::kFp8Block:
      return ceil_div(w.rows, Weight::kFp8BlockSize) * ceil_div(w.cols, Weight::kFp8BlockSize) *
             dtype_size(w.scales_dtype);
    case WeightFormat::kMxfp4:
      return w.rows * (w.cols / Weight::kMxfp4BlockSize);
    case WeightFormat::kInt4:
      return w.rows * (w.cols / Weight::kInt4GroupSize) * dtype_size(w.scales_dtype);
  }
  return 0;
}

DeviceWeight DeviceWeight::upload(const Weight& host) {
  CHECK(!host.empty() && host.rows > 0 && host.cols > 0, "DeviceWeight::upload: weight shape [",
        host.rows, ", ", host.cols, "]");
  CHECK(host.format == WeightFormat::kDense || host.scales != nullptr,
        "DeviceWeight::upload: quantized weight without scales");
  CHECK(host.format != WeightFormat::kMxfp4 || host.cols % Weight::kMxfp4BlockSize == 0,
        "DeviceWeight::upload: MXFP4 cols ", host.cols, " not a multiple of ",
        Weight::kMxfp4BlockSize);
  CHECK(host.format != WeightFormat::kInt4 || host.cols % Weight::kInt4GroupSize == 0,
        "DeviceWeight::upload: INT4 cols ", host.cols, " not a multiple of ",
        Weight::kInt4GroupSize);
  DeviceWeight d;
  const auto data_bytes = static_cast<size_t>(weight_data_bytes(host));
  d.data_ = DeviceBuffer(data_bytes);
  d.data_.upload(host.data, data_bytes);
  d.view_ = host;
  d.view_.data = d.data_.data();
  d.view_.scales = nullptr;
  if (host.format != WeightFormat::kDense) {
    const auto scale_bytes = static_cast<size_t>(weight_scales_bytes(host));
    d.scales_ = DeviceBuffer(scale_bytes);
    d.scales_.upload(host.scales, scale_bytes);
    d.view_.scales = d.scales_.data();
  }
  return d;
}

}  // namespace hyserve::cuda
