#include "core/cuda/device_weight.h"

#include "util/error.h"

namespace hyserve::cuda {

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
  const auto data_bytes = static_cast<size_t>(host.data_bytes());
  d.data_ = DeviceBuffer(data_bytes);
  d.data_.upload(host.data, data_bytes);
  d.view_ = host;
  d.view_.data = d.data_.data();
  d.view_.scales = nullptr;
  if (host.format != WeightFormat::kDense) {
    const auto scale_bytes = static_cast<size_t>(host.scale_bytes());
    d.scales_ = DeviceBuffer(scale_bytes);
    d.scales_.upload(host.scales, scale_bytes);
    d.view_.scales = d.scales_.data();
  }
  return d;
}

}  // namespace hyserve::cuda
