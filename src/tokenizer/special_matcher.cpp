// Special-token search: see special_matcher.h.
#include "tokenizer/special_matcher.h"

#include <algorithm>

#include "util/error.h"

namespace hyserve {

void SpecialMatcher::add(std::string content, int32_t id) {
  CHECK(!content.empty(), "empty special token (id ", id, ")");
  auto& bucket = by_first_byte_[static_cast<uint8_t>(content[0])];
  bucket.push_back({std::move(content), id});
  std::stable_sort(bucket.begin(), bucket.end(), [](const Entry& a, const Entry& b) {
    return a.content.size() > b.content.size();
  });
  ++num_tokens_;
}

std::optional<SpecialMatcher::Match> SpecialMatcher::find(std::string_view text,
                                                          std::size_t from) const {
  if (num_tokens_ == 0) return std::nullopt;
  for (std::size_t pos = from; pos < text.size(); ++pos) {
    for (const Entry& entry : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      if (text.substr(pos).starts_with(entry.content)) {
        return Match{pos, entry.content.size(), entry.id};
      }
    }
  }
  return std::nullopt;
}

}  // namespace hyserve
