// Incremental detokenization: see streaming_detokenizer.h.
#include "tokenizer/streaming_detokenizer.h"

#include "tokenizer/utf8.h"

namespace hyserve {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamingDetokenizer::push(std::span<const int32_t> ids) {
  pending_ += tokenizer_.decode_output(ids, skip_special_);
  std::string text;
  pending_.erase(0, append_lossy_utf8(pending_, false, text));
  return text;
}

std::string StreamingDetokenizer::finish() {
  std::string text = replace_invalid_utf8(pending_);
  pending_.clear();
  return text;
}

}  // namespace hyserve
