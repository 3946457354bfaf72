// The pre-tokenizer regex on PCRE2: see split_regex.h.
#include "tokenizer/split_regex.h"

#include <pcre2.h>

#include "util/error.h"

namespace hyserve {
namespace {

// Unicode White_Space (stable since Unicode 6.3): what \s means in Rust's regex crate and
// in Oniguruma for UTF-8 text.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
    R"(\x{205F}\x{3000})";

// General-category names (and PCRE2's own pseudo-properties) keep their meaning.
bool is_category_name(std::string_view name) {
  return name.size() <= 2 || name == "L&" || name == "Any" || name.starts_with("sc:") ||
         name.starts_with("scx:");
}

std::string pcre2_error(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Per-thread JIT stack: the default 32 KiB overflows on long whitespace or letter runs.
constexpr std::size_t kJitStackBytes = 8u << 20;
constexpr uint32_t kHeapLimitKib = 1u << 20;

struct ThreadMatchContext {
  ThreadMatchContext()
      : context(pcre2_match_context_create(nullptr)),
        jit_stack(pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr)) {
    CHECK(context != nullptr && jit_stack != nullptr, "out of memory for a PCRE2 context");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
    pcre2_set_heap_limit(context, kHeapLimitKib);
  }
  ~ThreadMatchContext() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
  }
  pcre2_match_context* context;
  pcre2_jit_stack* jit_stack;
};

}  // namespace

struct SplitRegex::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

std::string to_pcre2_pattern(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  std::size_t class_start = 0;  // index of the first member after '[' or '[^'
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : str_cat("[", kWhiteSpace, "]");
      } else if (e == 'S') {
        CHECK(!in_class, "regex '", pattern, "': \\S inside a character class is not supported");
        out += str_cat("[^", kWhiteSpace, "]");
      } else if (e == 'h' || e == 'H') {
        HYSERVE_THROW(InvalidArgument, "regex '", pattern, "': \\", e,
                      " means different things in Oniguruma and PCRE2; spell it out");
      } else if ((e == 'p' || e == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
        const std::size_t close = pattern.find('}', i + 3);
        CHECK(close != std::string_view::npos, "regex '", pattern, "': unterminated \\", e, "{");
        std::string_view name = pattern.substr(i + 3, close - (i + 3));
        const bool negated = name.starts_with('^');
        if (negated) name.remove_prefix(1);
        out += str_cat("\\", e, "{", negated ? "^" : "", is_category_name(name) ? "" : "sc:", name,
                       "}");
        i = close;
        continue;
      } else {
        out += pattern.substr(i, 2);
      }
      ++i;
      continue;
    }
    if (in_class) {
      CHECK(!(c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&'), "regex '", pattern,
            "': class intersection '&&' is not supported (rewrite it as a lookahead)");
      if (c == ']' && out.size() > class_start) in_class = false;
      if (c == '[') {
        const std::size_t posix_end = pattern.find(":]", i);
        CHECK(i + 1 < pattern.size() && pattern[i + 1] == ':' && posix_end != pattern.npos,
              "regex '", pattern, "': nested character classes are not supported");
        out += pattern.substr(i, posix_end + 2 - i);
        i = posix_end + 1;
        continue;
      }
      out += c;
      continue;
    }
    out += c;
    if (c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      class_start = out.size();
    }
  }
  return out;
}

SplitRegex::SplitRegex(std::string_view pattern)
    : pcre2_pattern_(to_pcre2_pattern(pattern)), compiled_(std::make_unique<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern_.data()), pcre2_pattern_.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  CHECK(compiled_->code != nullptr, "regex '", pattern, "' does not compile (as PCRE2 '",
        pcre2_pattern_, "'): ", pcre2_error(error_code), " at offset ", error_offset);
  // Without JIT support (or on failure) pcre2_match interprets; the results are the same.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

SplitRegex::~SplitRegex() = default;

std::vector<MatchSpan> SplitRegex::find_all(std::string_view text) const {
  thread_local ThreadMatchContext thread_context;
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  CHECK(data != nullptr, "out of memory for PCRE2 match data");
  std::vector<MatchSpan> spans;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start < text.size()) {
    uint32_t options = PCRE2_NO_UTF_CHECK;
    int rc = pcre2_match(compiled_->code, subject, text.size(), start, options, data,
                         thread_context.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      options |= PCRE2_NO_JIT;
      rc = pcre2_match(compiled_->code, subject, text.size(), start, options, data,
                       thread_context.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(data);
      HYSERVE_THROW(InvalidArgument, "regex '", pcre2_pattern_,
                    "' failed to match: ", pcre2_error(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const std::size_t begin = ovector[0];
    const std::size_t end = ovector[1];
    if (end > begin) {
      spans.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match: step over one character (continuation bytes have the form 10xxxxxx).
      start = begin + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  pcre2_match_data_free(data);
  return spans;
}

}  // namespace hyserve
