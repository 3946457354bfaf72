// Incremental detokenization for streamed responses: feed generated ids one at a time, get
// back only text that is final. A UTF-8 character split across tokens is held until its
// last byte arrives; bytes that can no longer become a valid character are emitted as U+FFFD.
// The concatenation of every push() and finish() equals
// replace_invalid_utf8(tokenizer.decode_output(all ids, skip_special)) (ids without a token
// read as nothing), and each returned string is
// valid UTF-8 on its own.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace hyserve {

class StreamingDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special);

  // The new final text after appending `ids` (possibly empty).
  std::string push(std::span<const int32_t> ids);
  std::string push(int32_t id) { return push(std::span<const int32_t>(&id, 1)); }

  // At the end of the stream: the held bytes, an incomplete character as U+FFFD.
  std::string finish();

  // Bytes held back because they may still complete a character (at most 3).
  std::size_t num_pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // undecided bytes: a prefix of one UTF-8 character
};

}  // namespace hyserve
