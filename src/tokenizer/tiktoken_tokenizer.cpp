// Kimi's tiktoken-format BPE: see tiktoken_tokenizer.h.
#include "tokenizer/tiktoken_tokenizer.h"

#include <charconv>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_merge.h"
#include "tokenizer/utf8.h"

namespace hyserve {

const std::string_view kKimiSplitPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

const std::array<KimiSpecialToken, 23> kKimiDefaultSpecialTokens = {{
    {0, "[BOS]", true},
    {1, "[EOS]", true},
    {2, "<|im_end|>", true},
    {3, "<|im_user|>", true},
    {4, "<|im_assistant|>", true},
    {6, "<|start_header_id|>", true},
    {7, "<|end_header_id|>", true},
    {9, "[EOT]", true},
    {10, "<|im_system|>", true},
    {11, "<|tool_calls_section_begin|>", true},
    {12, "<|tool_calls_section_end|>", true},
    {13, "<|tool_call_begin|>", true},
    {14, "<|tool_call_argument_begin|>", true},
    {15, "<|tool_call_end|>", true},
    {17, "<|im_middle|>", true},
    {18, "<|media_begin|>", true},
    {19, "<|media_content|>", true},
    {20, "<|media_end|>", true},
    {21, "<|media_pad|>", true},
    {22, "<think>", false},
    {23, "</think>", false},
    {254, "[UNK]", true},
    {255, "[PAD]", true},
}};

namespace {

// Standard base64 with '=' padding; nullopt on any other character.
std::optional<std::string> decode_base64(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::size_t padding = 0;
  while (padding < 2 && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  uint32_t bits = 0;
  int num_bits = 0;
  for (char c : text.substr(0, text.size() - padding)) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    num_bits += 6;
    if (num_bits >= 8) {
      num_bits -= 8;
      out.push_back(static_cast<char>((bits >> num_bits) & 0xFF));
    }
  }
  return out;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) HYSERVE_THROW(TokenizerError, path.string(), ": cannot open");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

TiktokenTokenizer::TiktokenTokenizer() : split_regex_(kKimiSplitPattern) {}

std::unique_ptr<TiktokenTokenizer> TiktokenTokenizer::load(const std::filesystem::path& model_dir) {
  std::unique_ptr<TiktokenTokenizer> tok(new TiktokenTokenizer());
  const std::filesystem::path model_path = model_dir / "tiktoken.model";
  const std::string file = read_file(model_path);

  std::vector<std::string> by_rank;
  std::size_t line_start = 0;
  for (int line_number = 1; line_start < file.size(); ++line_number) {
    std::size_t line_end = file.find('\n', line_start);
    if (line_end == std::string::npos) line_end = file.size();
    std::string_view line(file.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.empty()) continue;
    auto fail = [&](std::string_view what) {
      HYSERVE_THROW(TokenizerError, model_path.string(), ":", line_number, ": ", what);
    };
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos) fail("expected 'base64 rank'");
    const std::optional<std::string> bytes = decode_base64(line.substr(0, space));
    if (!bytes || bytes->empty()) fail("invalid base64 token");
    const std::string_view rank_text = line.substr(space + 1);
    int64_t rank = -1;
    const auto [end, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0 ||
        rank >= std::numeric_limits<int32_t>::max() - kNumReservedSpecial) {
      fail("invalid rank");
    }
    if (static_cast<std::size_t>(rank) >= by_rank.size()) by_rank.resize(rank + 1);
    if (!by_rank[rank].empty()) fail(str_cat("rank ", rank, " appears twice"));
    if (!tok->ranks_.emplace(*bytes, static_cast<int32_t>(rank)).second) {
      fail("token bytes appear twice");
    }
    by_rank[rank] = *bytes;
  }
  for (std::size_t rank = 0; rank < by_rank.size(); ++rank) {
    if (by_rank[rank].empty()) {
      HYSERVE_THROW(TokenizerError, model_path.string(), ": rank ", rank,
                    " is missing (ranks must be 0..N-1)");
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (!tok->ranks_.contains(std::string(1, static_cast<char>(b)))) {
      HYSERVE_THROW(TokenizerError, model_path.string(), ": byte ", b,
                    " has no token (every single byte must be in the vocabulary)");
    }
  }
  tok->num_base_ = static_cast<int32_t>(by_rank.size());
  tok->token_bytes_ = std::move(by_rank);

  const int32_t n = tok->num_base_;
  tok->specials_.resize(kNumReservedSpecial);
  for (int i = 0; i < kNumReservedSpecial; ++i) {
    tok->specials_[i] = {str_cat("<|reserved_token_", n + i, "|>"), true};
  }
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  nlohmann::json config;
  if (std::filesystem::exists(config_path)) {
    try {
      config = nlohmann::json::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      HYSERVE_THROW(TokenizerError, config_path.string(), ": ", e.what());
    }
  }
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    const nlohmann::json& added = config["added_tokens_decoder"];
    if (!added.is_object()) {
      HYSERVE_THROW(TokenizerError, config_path.string(),
                    ": added_tokens_decoder is not an object");
    }
    for (const auto& [key, entry] : added.items()) {
      const std::string field = str_cat("added_tokens_decoder[\"", key, "\"]");
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < n ||
          id >= n + kNumReservedSpecial) {
        HYSERVE_THROW(TokenizerError, config_path.string(), ": ", field,
                      ": id outside the reserved range [", n, ", ", n + kNumReservedSpecial, ")");
      }
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
          entry["content"].get<std::string>().empty()) {
        HYSERVE_THROW(TokenizerError, config_path.string(), ": ", field,
                      ".content must be a non-empty string");
      }
      const bool special = entry.value("special", true);
      tok->specials_[id - n] = {entry["content"].get<std::string>(), special};
    }
  } else {
    for (const KimiSpecialToken& named : kKimiDefaultSpecialTokens) {
      tok->specials_[named.offset] = {std::string(named.content), named.special};
    }
  }
  for (int i = 0; i < kNumReservedSpecial; ++i) {
    const std::string& content = tok->specials_[i].content;
    if (!tok->special_ids_.emplace(content, n + i).second) {
      HYSERVE_THROW(TokenizerError, config_path.string(), ": special token '", content,
                    "' appears twice");
    }
    tok->special_matcher_.add(content, n + i);
  }
  return tok;
}

int32_t TiktokenTokenizer::rank_of(std::string_view bytes) const {
  const auto it = ranks_.find(bytes);
  return it == ranks_.end() ? -1 : it->second;
}

void TiktokenTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (const int32_t whole = rank_of(piece); whole >= 0) {
    ids.push_back(whole);
    return;
  }
  using Span = std::pair<std::size_t, std::size_t>;  // [begin, end) bytes of the piece
  std::vector<Span> parts(piece.size());
  for (std::size_t k = 0; k < piece.size(); ++k) parts[k] = {k, k + 1};
  parts = merge_by_rank(std::move(parts), [&](const Span& left, const Span& right) {
    const int32_t rank = rank_of(piece.substr(left.first, right.second - left.first));
    return rank < 0 ? std::nullopt
                    : std::optional<std::pair<int32_t, Span>>({rank, {left.first, right.second}});
  });
  for (const auto& [begin, end] : parts) ids.push_back(rank_of(piece.substr(begin, end - begin)));
}

std::vector<std::string_view> TiktokenTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  for (const auto& [begin, end] : split_regex_.find_all(text)) {
    pieces.push_back(text.substr(begin, end - begin));
  }
  return pieces;
}

void TiktokenTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const {
  for (std::string_view piece : pre_tokenize(text)) encode_piece(piece, ids);
}

std::vector<int32_t> TiktokenTokenizer::encode(std::string_view text, bool allow_special) const {
  CHECK(is_valid_utf8(text), "text to encode is not valid UTF-8");
  std::vector<int32_t> ids;
  std::size_t pos = 0;
  while (true) {
    std::optional<SpecialMatcher::Match> match;
    if (allow_special) match = special_matcher_.find(text, pos);
    const std::size_t segment_end = match ? match->begin : text.size();
    encode_ordinary(text.substr(pos, segment_end - pos), ids);
    if (!match) break;
    ids.push_back(match->id);
    pos = match->begin + match->length;
  }
  return ids;
}

std::string TiktokenTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (const int32_t id : ids) {
    CHECK(id >= 0 && id < vocab_size(), "token id ", id, " outside [0, ", vocab_size(), ")");
    if (id < num_base_) {
      out += token_bytes_[id];
    } else if (!(skip_special && specials_[id - num_base_].special)) {
      out += specials_[id - num_base_].content;
    }
  }
  return out;
}

int32_t TiktokenTokenizer::token_id(std::string_view special) const {
  const auto it = special_ids_.find(special);
  return it == special_ids_.end() ? -1 : it->second;
}

bool TiktokenTokenizer::is_special(int32_t id) const {
  return id >= num_base_ && id < vocab_size() && specials_[id - num_base_].special;
}

bool TiktokenTokenizer::has_token(int32_t id) const {
  return id >= 0 && id < vocab_size();
}

}  // namespace hyserve
