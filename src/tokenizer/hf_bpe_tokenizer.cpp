// Hugging Face tokenizer.json byte-level BPE: see hf_bpe_tokenizer.h.
#include "tokenizer/hf_bpe_tokenizer.h"

#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_merge.h"
#include "tokenizer/utf8.h"

namespace hyserve {
namespace {

using nlohmann::json;

// tokenizers' ByteLevel pre-tokenizer regex (GPT-2's), used when use_regex is true.
constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100.. in byte order.
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// The bytes a byte-level token string stands for, or nullopt when a character is outside
// the byte alphabet (tokenizers' ByteLevel decoder then emits the token's own UTF-8).
std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  static const std::unordered_map<char32_t, char> kCharToByte = [] {
    std::unordered_map<char32_t, char> map;
    const std::array<char32_t, 256> table = byte_to_char();
    for (int b = 0; b < 256; ++b) map[table[b]] = static_cast<char>(b);
    return map;
  }();
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const auto lead = static_cast<uint8_t>(token[i]);
    const int length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length && i + k < token.size(); ++k) {
      c = (c << 6) | (static_cast<uint8_t>(token[i + k]) & 0x3F);
    }
    const auto it = kCharToByte.find(c);
    if (it == kCharToByte.end()) return std::nullopt;
    out.push_back(it->second);
    i += length;
  }
  return out;
}

std::string escape_literal(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool plain = static_cast<uint8_t>(c) >= 0x80 || (c >= '0' && c <= '9') ||
                       (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!plain) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// Reads a tokenizer.json and names the file in every error.
class JsonReader {
 public:
  explicit JsonReader(std::filesystem::path path) : path_(std::move(path)) {}

  [[noreturn]] void fail(std::string_view field, std::string_view what) const {
    HYSERVE_THROW(TokenizerError, path_.string(), ": ", field, ": ", what);
  }
  const json& require(const json& object, std::string_view field, std::string_view key) const {
    if (!object.is_object() || !object.contains(key)) fail(field, str_cat("missing \"", key, "\""));
    return object[std::string(key)];
  }
  std::string string_at(const json& object, std::string_view field, std::string_view key) const {
    const json& value = require(object, field, key);
    if (!value.is_string()) fail(str_cat(field, ".", key), "expected a string");
    return value.get<std::string>();
  }
  // True when object[key] is absent, null, false, or (for strings) empty.
  bool is_unset(const json& object, std::string_view key) const {
    if (!object.contains(key)) return true;
    const json& v = object[std::string(key)];
    return v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
           (v.is_string() && v.get<std::string>().empty());
  }
  void require_unset(const json& object, std::string_view field, std::string_view key) const {
    if (!is_unset(object, key)) {
      fail(str_cat(field, ".", key),
           str_cat("unsupported value ", object[std::string(key)].dump()));
    }
  }

 private:
  std::filesystem::path path_;
};

json parse_tokenizer_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) HYSERVE_THROW(TokenizerError, path.string(), ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    HYSERVE_THROW(TokenizerError, path.string(), ": ", e.what());
  }
}

}  // namespace

// load()'s steps, one per section of tokenizer.json, filling one tokenizer.
class HfBpeTokenizer::Loader {
 public:
  Loader(const std::filesystem::path& path, HfBpeTokenizer& tok) : reader_(path), tok_(tok) {}

  // Only an empty normalizer (none, or an empty Sequence) is supported.
  void check_normalizer(const json& root) const {
    if (!root.contains("normalizer") || root["normalizer"].is_null()) return;
    const json& normalizer = root["normalizer"];
    const std::string type = reader_.string_at(normalizer, "normalizer", "type");
    const bool empty_sequence = type == "Sequence" && normalizer.contains("normalizers") &&
                                normalizer["normalizers"].is_array() &&
                                normalizer["normalizers"].empty();
    if (!empty_sequence) reader_.fail("normalizer", str_cat("unsupported normalizer ", type));
  }

  // Isolated Split steps, then ByteLevel (with GPT-2's regex unless use_regex is false).
  void read_pre_tokenizer(const json& root) {
    const json& pre = reader_.require(root, "", "pre_tokenizer");
    std::vector<json> steps;
    if (pre.is_object() && pre.value("type", "") == "Sequence") {
      const json& list = reader_.require(pre, "pre_tokenizer", "pretokenizers");
      if (!list.is_array()) reader_.fail("pre_tokenizer.pretokenizers", "expected an array");
      steps.assign(list.begin(), list.end());
    } else {
      steps.push_back(pre);
    }
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const std::string field = str_cat("pre_tokenizer.pretokenizers[", i, "]");
      const json& step = steps[i];
      const std::string type = reader_.string_at(step, field, "type");
      if (type == "Split") {
        read_split(step, field);
      } else if (type == "ByteLevel") {
        if (i + 1 != steps.size()) reader_.fail(field, "ByteLevel must be the last pre-tokenizer");
        reader_.require_unset(step, field, "add_prefix_space");
        if (step.value("use_regex", true)) {
          tok_.splits_.push_back(std::make_unique<SplitRegex>(kGpt2SplitPattern));
        }
      } else {
        reader_.fail(field, str_cat("unsupported pre-tokenizer ", type));
      }
    }
    if (steps.empty() || steps.back().value("type", "") != "ByteLevel") {
      reader_.fail("pre_tokenizer", "a ByteLevel pre-tokenizer (last) is required");
    }
  }

  void check_decoder(const json& root) const {
    const json& decoder = reader_.require(root, "", "decoder");
    if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
      reader_.fail("decoder", str_cat("unsupported decoder ", decoder.dump(), " (ByteLevel only)"));
    }
  }

  // The BPE model's options, its vocabulary (with room for the added tokens' ids), unk_token
  // and merges.
  void read_model(const json& root, const json& added) {
    const json& model = reader_.require(root, "", "model");
    if (model.value("type", "BPE") != "BPE") {
      reader_.fail("model.type", str_cat("unsupported model ", model["type"].dump()));
    }
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix",
                            "fuse_unk", "byte_fallback"}) {
      reader_.require_unset(model, "model", key);
    }
    tok_.ignore_merges_ = model.value("ignore_merges", false);
    const std::unordered_map<std::string, int32_t> vocab_ids = read_vocab(model, added);
    if (!reader_.is_unset(model, "unk_token")) {
      const std::string unk = reader_.string_at(model, "model", "unk_token");
      const auto it = vocab_ids.find(unk);
      if (it == vocab_ids.end()) reader_.fail("model.unk_token", "not in the vocabulary");
      tok_.unk_id_ = it->second;
    }
    read_merges(model, vocab_ids);
  }

  // added_tokens, after the model: an added token overrides a vocabulary entry of its id.
  void read_added_tokens(const json& added) {
    for (std::size_t i = 0; i < added.size(); ++i) {
      const std::string field = str_cat("added_tokens[", i, "]");
      const json& entry = added[i];
      for (const char* key : {"single_word", "lstrip", "rstrip"}) {
        reader_.require_unset(entry, field, key);
      }
      const auto id = entry["id"].get<int32_t>();
      const std::string content = reader_.string_at(entry, field, "content");
      if (content.empty()) reader_.fail(field + ".content", "empty");
      const bool special = entry.value("special", false);
      const std::optional<std::string> bytes = byte_level_to_bytes(content);
      tok_.tokens_[id] = {bytes ? *bytes : content, true, special};
      tok_.added_ids_[content] = id;
      (entry.value("normalized", !special) ? tok_.normalized_added_ : tok_.raw_added_)
          .add(content, id);
    }
  }

 private:
  void read_split(const json& step, const std::string& field) {
    if (reader_.string_at(step, field, "behavior") != "Isolated") {
      reader_.fail(field + ".behavior", "only Isolated is supported");
    }
    reader_.require_unset(step, field, "invert");
    const json& pattern = reader_.require(step, field, "pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = reader_.string_at(pattern, field + ".pattern", "Regex");
    } else {
      regex = escape_literal(reader_.string_at(pattern, field + ".pattern", "String"));
    }
    try {
      tok_.splits_.push_back(std::make_unique<SplitRegex>(regex));
    } catch (const InvalidArgument& e) {
      reader_.fail(field + ".pattern", e.what());
    }
  }

  // The largest id of model.vocab and added_tokens, each checked to be in [0, INT32_MAX).
  int64_t max_token_id(const json& vocab, const json& added) const {
    int64_t max_id = -1;
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
        reader_.fail(str_cat("model.vocab[\"", token, "\"]"), "expected an id >= 0");
      }
      max_id = std::max(max_id, id.get<int64_t>());
    }
    if (!added.is_array()) reader_.fail("added_tokens", "expected an array");
    for (std::size_t i = 0; i < added.size(); ++i) {
      const json& id = reader_.require(added[i], str_cat("added_tokens[", i, "]"), "id");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
        reader_.fail(str_cat("added_tokens[", i, "].id"), "expected an id >= 0");
      }
      max_id = std::max(max_id, id.get<int64_t>());
    }
    return max_id;
  }

  // tokens_, byte_vocab_ and byte_ids_ from model.vocab; returns the vocab's token -> id.
  std::unordered_map<std::string, int32_t> read_vocab(const json& model, const json& added) {
    const json& vocab = reader_.require(model, "model", "vocab");
    if (!vocab.is_object()) reader_.fail("model.vocab", "expected an object");
    tok_.tokens_.resize(max_token_id(vocab, added) + 1);
    std::unordered_map<std::string, int32_t> vocab_ids;
    for (const auto& [token, id_json] : vocab.items()) {
      const auto id = id_json.get<int32_t>();
      vocab_ids.emplace(token, id);
      const std::optional<std::string> bytes = byte_level_to_bytes(token);
      tok_.tokens_[id] = {bytes ? *bytes : token, true, false};
      if (bytes) tok_.byte_vocab_.emplace(*bytes, id);
    }
    for (int b = 0; b < 256; ++b) {
      const auto it = tok_.byte_vocab_.find(std::string(1, static_cast<char>(b)));
      tok_.byte_ids_[b] = it == tok_.byte_vocab_.end() ? -1 : it->second;
    }
    return vocab_ids;
  }

  // model.merges ("left right" or ["left", "right"]) by rank into merges_.
  void read_merges(const json& model, const std::unordered_map<std::string, int32_t>& vocab_ids) {
    const json& merges = reader_.require(model, "model", "merges");
    if (!merges.is_array()) reader_.fail("model.merges", "expected an array");
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string field = str_cat("model.merges[", rank, "]");
      const json& merge = merges[rank];
      std::string left, right;
      if (merge.is_string()) {
        const std::string line = merge.get<std::string>();
        const std::size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          reader_.fail(field, "expected \"left right\"");
        }
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        reader_.fail(field, "expected \"left right\" or [\"left\", \"right\"]");
      }
      const auto left_it = vocab_ids.find(left);
      const auto right_it = vocab_ids.find(right);
      const auto merged_it = vocab_ids.find(left + right);
      if (left_it == vocab_ids.end() || right_it == vocab_ids.end() ||
          merged_it == vocab_ids.end()) {
        reader_.fail(field, "a token of the merge (or the merged token) is not in the vocabulary");
      }
      const uint64_t key =
          (static_cast<uint64_t>(left_it->second) << 32) | static_cast<uint32_t>(right_it->second);
      // Like tokenizers' HashMap collect: a repeated pair keeps its last rank.
      tok_.merges_[key] = {static_cast<int32_t>(rank), merged_it->second};
    }
  }

 public:
  // The special tokens the post-processor puts around one sequence (Tokenizer::special_prefix):
  // none for null or ByteLevel; TemplateProcessing's "single" (its SpecialToken entries before
  // and after the Sequence, by their special_tokens ids); a Sequence of those.
  void read_post_processor(const json& root) const {
    if (!root.contains("post_processor") || root["post_processor"].is_null()) return;
    std::vector<int32_t> prefix, suffix;
    read_processor(root["post_processor"], "post_processor", prefix, suffix);
    tok_.set_special_affixes(std::move(prefix), std::move(suffix));
  }

 private:
  JsonReader reader_;
  HfBpeTokenizer& tok_;

  void read_processor(const json& p, const std::string& field, std::vector<int32_t>& prefix,
                      std::vector<int32_t>& suffix) const {
    const std::string type = reader_.string_at(p, field, "type");
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      const json& list = reader_.require(p, field, "processors");
      if (!list.is_array()) reader_.fail(field + ".processors", "expected a list");
      for (size_t i = 0; i < list.size(); ++i) {
        read_processor(list[i], str_cat(field, ".processors[", i, "]"), prefix, suffix);
      }
      return;
    }
    if (type != "TemplateProcessing") {
      reader_.fail(field, str_cat("unsupported post-processor ", type,
                                  " (TemplateProcessing, ByteLevel or a Sequence of them)"));
    }
    const json& single = reader_.require(p, field, "single");
    const json& specials = reader_.require(p, field, "special_tokens");
    if (!single.is_array()) reader_.fail(field + ".single", "expected a list");
    bool after = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string item = str_cat(field, ".single[", i, "]");
      if (single[i].is_object() && single[i].contains("Sequence")) {
        after = true;
        continue;
      }
      if (!single[i].is_object() || !single[i].contains("SpecialToken")) {
        reader_.fail(item, "expected a Sequence or a SpecialToken");
      }
      const std::string name = reader_.string_at(single[i]["SpecialToken"], item, "id");
      const json& entry = reader_.require(specials, field + ".special_tokens", name);
      const json& ids = reader_.require(entry, str_cat(field, ".special_tokens.", name), "ids");
      if (!ids.is_array())
        reader_.fail(str_cat(field, ".special_tokens.", name, ".ids"), "expected a list");
      for (const json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= tok_.vocab_size() || !tok_.has_token(id.get<int32_t>())) {
          reader_.fail(str_cat(field, ".special_tokens.", name, ".ids"),
                       str_cat(id.dump(), " is not a token of the vocabulary"));
        }
        (after ? suffix : prefix).push_back(id.get<int32_t>());
      }
    }
  }
};

std::unique_ptr<HfBpeTokenizer> HfBpeTokenizer::load(const std::filesystem::path& path) {
  const json root = parse_tokenizer_json(path);
  std::unique_ptr<HfBpeTokenizer> tok(new HfBpeTokenizer());
  Loader loader(path, *tok);
  loader.check_normalizer(root);
  loader.read_pre_tokenizer(root);
  loader.check_decoder(root);
  const json& added = root.contains("added_tokens") ? root["added_tokens"] : json::array();
  loader.read_model(root, added);
  loader.read_added_tokens(added);
  loader.read_post_processor(root);
  return tok;
}

void HfBpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    if (const auto it = byte_vocab_.find(piece); it != byte_vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      symbols.push_back(id);
    } else if (unk_id_ >= 0) {
      symbols.push_back(unk_id_);
    }
  }
  symbols = merge_by_rank(std::move(symbols), [&](int32_t left, int32_t right) {
    const auto it =
        merges_.find((static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right));
    return it == merges_.end() ? std::nullopt
                               : std::optional<std::pair<int32_t, int32_t>>(
                                     {it->second.rank, it->second.merged_id});
  });
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

std::vector<std::string_view> HfBpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  for (const auto& split : splits_) {
    std::vector<std::string_view> next;
    for (std::string_view piece : pieces) {
      std::size_t pos = 0;
      for (const auto& [begin, end] : split->find_all(piece)) {
        if (begin > pos) next.push_back(piece.substr(pos, begin - pos));
        next.push_back(piece.substr(begin, end - begin));
        pos = end;
      }
      if (pos < piece.size()) next.push_back(piece.substr(pos));
    }
    pieces = std::move(next);
  }
  return pieces;
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view text, bool allow_special) const {
  CHECK(is_valid_utf8(text), "text to encode is not valid UTF-8");
  // Segments of the text: an added token (id >= 0) or ordinary text (id -1).
  struct Segment {
    std::string_view text;
    int32_t id;
  };
  auto split_added = [&](const std::vector<Segment>& in, const SpecialMatcher& matcher) {
    std::vector<Segment> out;
    for (const Segment& segment : in) {
      if (segment.id >= 0 || matcher.empty()) {
        out.push_back(segment);
        continue;
      }
      std::string_view s = segment.text;
      std::size_t pos = 0;     // start of the pending ordinary text
      std::size_t search = 0;  // where the next match may start
      while (const auto match = matcher.find(s, search)) {
        search = match->begin + match->length;
        if (!allow_special && tokens_[match->id].special) continue;
        if (match->begin > pos) out.push_back({s.substr(pos, match->begin - pos), -1});
        out.push_back({s.substr(match->begin, match->length), match->id});
        pos = search;
      }
      if (pos < s.size()) out.push_back({s.substr(pos), -1});
    }
    return out;
  };
  const std::vector<Segment> segments =
      split_added(split_added({{text, -1}}, raw_added_), normalized_added_);
  std::vector<int32_t> ids;
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      for (std::string_view piece : pre_tokenize(segment.text)) encode_piece(piece, ids);
    }
  }
  return ids;
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (const int32_t id : ids) {
    CHECK(id >= 0 && id < vocab_size() && tokens_[id].assigned, "token id ", id,
          " is not in the vocabulary");
    const Token& token = tokens_[id];
    if (!(skip_special && token.special)) out += token.bytes;
  }
  return out;
}

int32_t HfBpeTokenizer::token_id(std::string_view special) const {
  const auto it = added_ids_.find(special);
  return it == added_ids_.end() ? -1 : it->second;
}

bool HfBpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && tokens_[id].special;
}

bool HfBpeTokenizer::has_token(int32_t id) const {
  return id >= 0 && id < vocab_size() && tokens_[id].assigned;
}

}  // namespace hyserve
