// Tokenizer::load: picks the format the checkpoint ships.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/hf_bpe_tokenizer.h"
#include "tokenizer/tiktoken_tokenizer.h"

namespace hyserve {

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& model_dir) {
  if (std::filesystem::exists(model_dir / "tiktoken.model")) {
    return TiktokenTokenizer::load(model_dir);
  }
  if (std::filesystem::exists(model_dir / "tokenizer.json")) {
    return HfBpeTokenizer::load(model_dir / "tokenizer.json");
  }
  HYSERVE_THROW(TokenizerError, model_dir.string(),
                ": no tokenizer (neither tiktoken.model nor tokenizer.json)");
}

std::string Tokenizer::decode_output(std::span<const int32_t> ids, bool skip_special) const {
  if (std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return has_token(id); })) {
    return decode(ids, skip_special);
  }
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (const int32_t id : ids) {
    if (has_token(id)) known.push_back(id);
  }
  return decode(known, skip_special);
}

}  // namespace hyserve
