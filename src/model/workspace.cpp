#include "model/workspace.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {
namespace {
constexpr size_t kMinBlock = size_t{1} << 20;
}  // namespace

void Workspace::reset() {
  current_ = 0;
  offset_ = 0;
}

void Workspace::rewind(Mark m) {
  CHECK(m.block < current_ || (m.block == current_ && m.offset <= offset_),
        "workspace rewind past the current position");
  current_ = m.block;
  offset_ = m.offset;
}

void* Workspace::take(size_t num_bytes) {
  const size_t need = (num_bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  while (current_ < blocks_.size()) {
    if (offset_ + need <= blocks_[current_].size()) {
      void* p = static_cast<char*>(blocks_[current_].data()) + offset_;
      offset_ += need;
      return p;
    }
    if (current_ + 1 == blocks_.size()) break;
    ++current_;
    offset_ = 0;
  }
  CHECK(!frozen_, "workspace is frozen at ", capacity_bytes(), " bytes and cannot grow by ", need,
        " (the step is larger than the one it was sized for)");
  const size_t size = std::max({need, kMinBlock, capacity_bytes()});
  blocks_.emplace_back(device_, size);
  current_ = blocks_.size() - 1;
  offset_ = need;
  return blocks_.back().data();
}

void Workspace::reserve(size_t num_bytes) {
  CHECK(!frozen_, "reserve on a frozen workspace");
  const size_t total = std::max(num_bytes, capacity_bytes());
  if (blocks_.size() != 1 || blocks_[0].size() < total) {
    blocks_.clear();
    blocks_.emplace_back(device_, total);
  }
  reset();
}

void Workspace::freeze() {
  if (blocks_.size() > 1) {
    const size_t total = capacity_bytes();
    blocks_.clear();
    blocks_.emplace_back(device_, total);
  }
  reset();
  frozen_ = true;
}

size_t Workspace::capacity_bytes() const {
  size_t total = 0;
  for (const auto& b : blocks_) total += b.size();
  return total;
}

}  // namespace hyserve
