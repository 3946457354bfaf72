// Tokenizer::load: picks the format the checkpoint ships.
#include "tokenizer/tokenizer.h"

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

}  // namespace hyserve
