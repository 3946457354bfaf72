// The tokenizer of a server started with --skip-tokenizer-init (vLLM's flag): there is none,
// so ids decode to no text (vLLM's detokenize=False: outputs carry token ids, not text) and
// encoding refuses. OpenAIServer (skip_tokenizer_init) refuses every request that needs text
// before it gets here; this keeps the id-only path free of special cases.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace hyserve {

class NoTokenizer : public Tokenizer {
 public:
  explicit NoTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {}

  std::vector<int32_t> encode(std::string_view, bool) const override {
    HYSERVE_THROW(InvalidArgument, "no tokenizer (--skip-tokenizer-init): text cannot be encoded");
  }
  std::string decode(std::span<const int32_t>, bool) const override { return {}; }
  int32_t token_id(std::string_view) const override { return -1; }
  bool is_special(int32_t) const override { return false; }
  bool has_token(int32_t id) const override { return id >= 0 && id < vocab_size_; }
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  int64_t vocab_size_;
};

}  // namespace hyserve
