// UTF-8 validation and lossy decoding, shared by the tokenizers (which refuse invalid input)
// and the streaming detokenizer (which must never emit half a character).
//
// Invalid bytes become U+FFFD one "maximal subpart" at a time (Unicode 15, section 3.9,
// U+FFFD substitution of maximal subparts), the rule Python's bytes.decode(errors="replace")
// and Rust's String::from_utf8_lossy follow, so lossy text matches tiktoken's and
// tokenizers' decode byte for byte.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace hyserve {

// True when `bytes` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid_utf8(std::string_view bytes);

// Appends to `out` the well-formed characters of `bytes`, with U+FFFD for every maximal
// invalid subpart, and returns how many bytes it consumed. When `final` is false, a trailing
// incomplete sequence that could still become valid stays unconsumed (the caller keeps it
// and retries with more bytes); when true, it becomes one U+FFFD.
std::size_t append_lossy_utf8(std::string_view bytes, bool final, std::string& out);

// `bytes` with invalid subparts replaced by U+FFFD.
std::string replace_invalid_utf8(std::string_view bytes);

}  // namespace hyserve
