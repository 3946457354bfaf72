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

}  // namespace

std::unique_ptr<HfBpeTokenizer> HfBpeTokenizer::load(const std::filesystem::path& path) {
  JsonReader reader(path);
  json root;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) HYSERVE_THROW(TokenizerError, path.string(), ": cannot open");
    try {
      root = json::parse(in);
    } catch (const json::exception& e) {
      HYSERVE_THROW(TokenizerError, path.string(), ": ", e.what());
    }
  }
  std::unique_ptr<HfBpeTokenizer> tok(new HfBpeTokenizer());

  // normalizer
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& normalizer = root["normalizer"];
    const std::string type = reader.string_at(normalizer, "normalizer", "type");
    const bool empty_sequence = type == "Sequence" && normalizer.contains("normalizers") &&
                                normalizer["normalizers"].is_array() &&
                                normalizer["normalizers"].empty();
    if (!empty_sequence) reader.fail("normalizer", str_cat("unsupported normalizer ", type));
  }

  // pre_tokenizer
  const json& pre = reader.require(root, "", "pre_tokenizer");
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    const json& list = reader.require(pre, "pre_tokenizer", "pretokenizers");
    if (!list.is_array()) reader.fail("pre_tokenizer.pretokenizers", "expected an array");
    steps.assign(list.begin(), list.end());
  } else {
    steps.push_back(pre);
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string field = str_cat("pre_tokenizer.pretokenizers[", i, "]");
    const json& step = steps[i];
    const std::string type = reader.string_at(step, field, "type");
    if (type == "Split") {
      if (reader.string_at(step, field, "behavior") != "Isolated") {
        reader.fail(field + ".behavior", "only Isolated is supported");
      }
      reader.require_unset(step, field, "invert");
      const json& pattern = reader.require(step, field, "pattern");
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = reader.string_at(pattern, field + ".pattern", "Regex");
      } else {
        regex = escape_literal(reader.string_at(pattern, field + ".pattern", "String"));
      }
      try {
        tok->splits_.push_back(std::make_unique<SplitRegex>(regex));
      } catch (const InvalidArgument& e) {
        reader.fail(field + ".pattern", e.what());
      }
    } else if (type == "ByteLevel") {
      if (i + 1 != steps.size()) reader.fail(field, "ByteLevel must be the last pre-tokenizer");
      reader.require_unset(step, field, "add_prefix_space");
      if (step.value("use_regex", true)) {
        tok->splits_.push_back(std::make_unique<SplitRegex>(kGpt2SplitPattern));
      }
    } else {
      reader.fail(field, str_cat("unsupported pre-tokenizer ", type));
    }
  }
  if (steps.empty() || steps.back().value("type", "") != "ByteLevel") {
    reader.fail("pre_tokenizer", "a ByteLevel pre-tokenizer (last) is required");
  }

  // decoder
  const json& decoder = reader.require(root, "", "decoder");
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
    reader.fail("decoder", str_cat("unsupported decoder ", decoder.dump(), " (ByteLevel only)"));
  }

  // model
  const json& model = reader.require(root, "", "model");
  if (model.value("type", "BPE") != "BPE") {
    reader.fail("model.type", str_cat("unsupported model ", model["type"].dump()));
  }
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                          "byte_fallback"}) {
    reader.require_unset(model, "model", key);
  }
  tok->ignore_merges_ = model.value("ignore_merges", false);
  const json& vocab = reader.require(model, "model", "vocab");
  if (!vocab.is_object()) reader.fail("model.vocab", "expected an object");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      reader.fail(str_cat("model.vocab[\"", token, "\"]"), "expected an id >= 0");
    }
    max_id = std::max(max_id, id.get<int64_t>());
  }
  const json& added = root.contains("added_tokens") ? root["added_tokens"] : json::array();
  if (!added.is_array()) reader.fail("added_tokens", "expected an array");
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& id = reader.require(added[i], str_cat("added_tokens[", i, "]"), "id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      reader.fail(str_cat("added_tokens[", i, "].id"), "expected an id >= 0");
    }
    max_id = std::max(max_id, id.get<int64_t>());
  }
  tok->tokens_.resize(max_id + 1);
  std::unordered_map<std::string, int32_t> vocab_ids;
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    vocab_ids.emplace(token, id);
    const std::optional<std::string> bytes = byte_level_to_bytes(token);
    tok->tokens_[id] = {bytes ? *bytes : token, true, false};
    if (bytes) tok->byte_vocab_.emplace(*bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = tok->byte_vocab_.find(std::string(1, static_cast<char>(b)));
    tok->byte_ids_[b] = it == tok->byte_vocab_.end() ? -1 : it->second;
  }
  if (!reader.is_unset(model, "unk_token")) {
    const std::string unk = reader.string_at(model, "model", "unk_token");
    const auto it = vocab_ids.find(unk);
    if (it == vocab_ids.end()) reader.fail("model.unk_token", "not in the vocabulary");
    tok->unk_id_ = it->second;
  }
  const json& merges = reader.require(model, "model", "merges");
  if (!merges.is_array()) reader.fail("model.merges", "expected an array");
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string field = str_cat("model.merges[", rank, "]");
    const json& merge = merges[rank];
    std::string left, right;
    if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        reader.fail(field, "expected \"left right\"");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      reader.fail(field, "expected \"left right\" or [\"left\", \"right\"]");
    }
    const auto left_it = vocab_ids.find(left);
    const auto right_it = vocab_ids.find(right);
    const auto merged_it = vocab_ids.find(left + right);
    if (left_it == vocab_ids.end() || right_it == vocab_ids.end() || merged_it == vocab_ids.end()) {
      reader.fail(field, "a token of the merge (or the merged token) is not in the vocabulary");
    }
    const uint64_t key =
        (static_cast<uint64_t>(left_it->second) << 32) | static_cast<uint32_t>(right_it->second);
    // Like tokenizers' HashMap collect: a repeated pair keeps its last rank.
    tok->merges_[key] = {static_cast<int32_t>(rank), merged_it->second};
  }

  // added_tokens
  for (std::size_t i = 0; i < added.size(); ++i) {
    const std::string field = str_cat("added_tokens[", i, "]");
    const json& entry = added[i];
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      reader.require_unset(entry, field, key);
    }
    const auto id = entry["id"].get<int32_t>();
    const std::string content = reader.string_at(entry, field, "content");
    if (content.empty()) reader.fail(field + ".content", "empty");
    const bool special = entry.value("special", false);
    const std::optional<std::string> bytes = byte_level_to_bytes(content);
    tok->tokens_[id] = {bytes ? *bytes : content, true, special};
    tok->added_ids_[content] = id;
    (entry.value("normalized", !special) ? tok->normalized_added_ : tok->raw_added_)
        .add(content, id);
  }
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

}  // namespace hyserve
