#include "guided/json_matcher.h"

#include <algorithm>
#include <array>
#include <utility>

#include "util/error.h"

namespace hyserve {
namespace {

enum FrameKind : uint8_t { kValue, kObject, kKey, kArray, kString, kNumber, kKeyword, kLiteral };

// Object phases: after '{', after ',', after a key, inside a value, after a value.
enum : uint8_t { kObjectOpen, kObjectNextKey, kObjectAfterKey, kObjectInValue, kObjectAfterValue };
// Array phases: after '[', inside an item, after an item.
enum : uint8_t { kArrayOpen, kArrayInItem, kArrayAfterItem };

constexpr std::array<std::string_view, 3> kKeywords = {"true", "false", "null"};

bool is_ws(uint8_t b) {
  return b == ' ' || b == '\n' || b == '\r' || b == '\t';
}
bool is_digit(uint8_t b) {
  return b >= '0' && b <= '9';
}
bool is_hex(uint8_t b) {
  return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

bool take_ws(JsonMatcher::Frame& f) {
  if (f.ws >= JsonMatcher::kMaxWhitespace) return false;
  ++f.ws;
  return true;
}

}  // namespace

// UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). States: 0 none pending;
// 1 one continuation byte left (80-BF); 2 two left (80-BF); 3 two left, next A0-BF (after
// E0); 4 two left, next 80-9F (after ED); 5 three left, next 90-BF (after F0); 6 three
// left (80-BF); 7 three left, next 80-8F (after F4). Returns the next state, -1 if invalid.
int JsonMatcher::utf8_next(uint8_t state, uint8_t b) {
  if (state == 0) {
    if (b < 0x80) return 0;
    if (b >= 0xC2 && b <= 0xDF) return 1;
    if (b == 0xE0) return 3;
    if (b == 0xED) return 4;
    if (b >= 0xE1 && b <= 0xEF) return 2;
    if (b == 0xF0) return 5;
    if (b >= 0xF1 && b <= 0xF3) return 6;
    if (b == 0xF4) return 7;
    return -1;
  }
  static constexpr std::array<uint8_t, 8> kLow = {0, 0x80, 0x80, 0xA0, 0x80, 0x90, 0x80, 0x80};
  static constexpr std::array<uint8_t, 8> kHigh = {0, 0xBF, 0xBF, 0xBF, 0x9F, 0xBF, 0xBF, 0x8F};
  static constexpr std::array<uint8_t, 8> kAfter = {0, 0, 1, 1, 1, 2, 2, 2};
  if (b < kLow[state] || b > kHigh[state]) return -1;
  return kAfter[state];
}

namespace {

enum class StringByte { kReject, kPart, kChar, kClose };

// One byte of a string body. phase: 0 plain, 1 after '\', 2..5 inside \u after phase-2 digits.
StringByte string_byte(uint8_t& phase, uint8_t& utf8, uint8_t b) {
  if (phase == 0) {
    if (utf8 == 0) {
      if (b == '"') return StringByte::kClose;
      if (b == '\\') {
        phase = 1;
        return StringByte::kPart;
      }
      if (b < 0x20) return StringByte::kReject;
    }
    const int next = JsonMatcher::utf8_next(utf8, b);
    if (next < 0) return StringByte::kReject;
    utf8 = static_cast<uint8_t>(next);
    return next == 0 ? StringByte::kChar : StringByte::kPart;
  }
  if (phase == 1) {
    if (b == 'u') {
      phase = 2;
      return StringByte::kPart;
    }
    if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
        b == 't') {
      phase = 0;
      return StringByte::kChar;
    }
    return StringByte::kReject;
  }
  if (!is_hex(b)) return StringByte::kReject;
  phase = phase == 5 ? 0 : static_cast<uint8_t>(phase + 1);
  return phase == 0 ? StringByte::kChar : StringByte::kPart;
}

// Number states: 1 after '-', 2 a leading 0, 3 integer digits, 4 after '.', 5 fraction
// digits, 6 after 'e', 7 after the exponent sign, 8 exponent digits. -1: b ends the number.
int number_next(uint8_t state, uint8_t b, bool integer_only) {
  const bool digit = is_digit(b);
  const bool exp = (b == 'e' || b == 'E') && !integer_only;
  const bool dot = b == '.' && !integer_only;
  switch (state) {
    case 1:
      return b == '0' ? 2 : digit ? 3 : -1;
    case 2:
      return dot ? 4 : exp ? 6 : -1;
    case 3:
      return digit ? 3 : dot ? 4 : exp ? 6 : -1;
    case 4:
      return digit ? 5 : -1;
    case 5:
      return digit ? 5 : exp ? 6 : -1;
    case 6:
      return (b == '+' || b == '-') ? 7 : digit ? 8 : -1;
    case 7:
    case 8:
      return digit ? 8 : -1;
    default:
      return -1;
  }
}

bool number_complete(uint8_t state) {
  return state == 2 || state == 3 || state == 5 || state == 8;
}

int32_t item_node(const GrammarNode& n, uint32_t index) {
  return index < n.prefix_items.size() ? n.prefix_items[index] : n.items;
}

bool can_add_item(const GrammarNode& n, uint32_t count) {
  return (n.max_items < 0 || count < n.max_items) && item_node(n, count) >= 0;
}

bool can_add_key(const GrammarNode& n, uint64_t seen) {
  return n.additional >= 0 || (n.all_properties() & ~seen) != 0;
}

bool has_required(const GrammarNode& n, uint64_t seen) {
  return (n.required & ~seen) == 0;
}

JsonMatcher::Frame make_frame(uint8_t kind, int32_t node, int32_t aux = -1) {
  JsonMatcher::Frame f;
  f.kind = kind;
  f.node = node;
  f.aux = aux;
  return f;
}

// The value on top of the stack is complete and popped: its container moves on.
void value_done(std::vector<JsonMatcher::Frame>& s) {
  if (s.empty()) return;
  JsonMatcher::Frame& p = s.back();
  p.ws = 0;
  if (p.kind == kObject) {
    p.phase = kObjectAfterValue;
  } else if (p.kind == kArray) {
    ++p.count;
    p.phase = kArrayAfterItem;
  }
}

}  // namespace

JsonMatcher::JsonMatcher(const Grammar& grammar) : grammar_(&grammar) {
  CHECK(grammar.root >= 0 && grammar.root < static_cast<int32_t>(grammar.nodes.size()),
        "JsonMatcher: the grammar has no root");
  Stack s;
  if (grammar.raw_root) {
    const GrammarNode& root = node(grammar.root);
    CHECK(root.kind == NodeKind::kLiterals, "JsonMatcher: a raw root must be a literals node");
    s.push_back(make_frame(kLiteral, grammar.root, root.literal_trie));
  } else {
    s.push_back(make_frame(kValue, grammar.root));
  }
  threads_.push_back(std::move(s));
}

bool JsonMatcher::start_value(Frame& f, uint8_t b, size_t depth) const {
  const uint8_t types = node(f.node).types;
  const int32_t id = f.node;
  if ((b == '{' || b == '[') && depth > kMaxDepth) return false;
  if (b == '{' && (types & kJsonObject)) {
    f = make_frame(kObject, id);
    f.phase = kObjectOpen;
  } else if (b == '[' && (types & kJsonArray)) {
    f = make_frame(kArray, id);
    f.phase = kArrayOpen;
  } else if (b == '"' && (types & kJsonString)) {
    f = make_frame(kString, id);
  } else if ((b == '-' || is_digit(b)) && (types & (kJsonNumber | kJsonInteger))) {
    f = make_frame(kNumber, id, (types & kJsonNumber) ? 0 : 1);
    f.phase = b == '-' ? 1 : b == '0' ? 2 : 3;
    f.count = 1;
  } else if ((b == 't' || b == 'f') && (types & kJsonBoolean)) {
    f = make_frame(kKeyword, id, b == 't' ? 0 : 1);
    f.count = 1;
  } else if (b == 'n' && (types & kJsonNull)) {
    f = make_frame(kKeyword, id, 2);
    f.count = 1;
  } else {
    return false;
  }
  return true;
}

JsonMatcher::Step JsonMatcher::step(Stack& s, uint8_t b) const {
  for (;;) {
    if (s.empty()) return Step::kReject;
    Step r = Step::kReject;
    switch (s.back().kind) {
      case kValue:
        r = step_value(s, b);
        break;
      case kLiteral:
        r = step_literal(s, b);
        break;
      case kKeyword:
        r = step_keyword(s, b);
        break;
      case kNumber:
        r = step_number(s, b);
        break;
      case kString:
        r = step_string(s, b);
        break;
      case kKey:
        r = step_key(s, b);
        break;
      case kObject:
        r = step_object(s, b);
        break;
      case kArray:
        r = step_array(s, b);
        break;
      default:
        return Step::kReject;
    }
    if (r != Step::kRetry) return r;
  }
}

JsonMatcher::Step JsonMatcher::step_value(Stack& s, uint8_t b) const {
  Frame& f = s.back();
  if (is_ws(b)) return take_ws(f) ? Step::kOk : Step::kReject;
  const GrammarNode& n = node(f.node);
  if (n.kind == NodeKind::kAnyOf) return Step::kFork;
  if (n.kind == NodeKind::kLiterals) {
    f = make_frame(kLiteral, f.node, n.literal_trie);
    return Step::kRetry;
  }
  return start_value(f, b, s.size()) ? Step::kOk : Step::kReject;
}

JsonMatcher::Step JsonMatcher::step_literal(Stack& s, uint8_t b) const {
  const ByteTrie& trie = grammar_->trie;
  Frame& f = s.back();
  const int32_t c = trie.child(f.aux, b);
  if (c >= 0) {
    f.aux = c;
    if (trie.value(c) >= 0 && !trie.has_children(c)) {
      s.pop_back();
      value_done(s);
    }
    return Step::kOk;
  }
  if (trie.value(f.aux) < 0) return Step::kReject;
  s.pop_back();
  value_done(s);
  return Step::kRetry;  // b belongs to the container
}

JsonMatcher::Step JsonMatcher::step_keyword(Stack& s, uint8_t b) const {
  Frame& f = s.back();
  const std::string_view word = kKeywords[static_cast<size_t>(f.aux)];
  if (b != static_cast<uint8_t>(word[f.count])) return Step::kReject;
  if (++f.count == word.size()) {
    s.pop_back();
    value_done(s);
  }
  return Step::kOk;
}

JsonMatcher::Step JsonMatcher::step_number(Stack& s, uint8_t b) const {
  Frame& f = s.back();
  const bool room = f.count < kMaxNumberBytes || !number_complete(f.phase);
  const int next = room ? number_next(f.phase, b, f.aux == 1) : -1;
  if (next >= 0) {
    f.phase = static_cast<uint8_t>(next);
    ++f.count;
    return Step::kOk;
  }
  if (!number_complete(f.phase)) return Step::kReject;
  s.pop_back();
  value_done(s);
  return Step::kRetry;  // b belongs to the container
}

JsonMatcher::Step JsonMatcher::step_string(Stack& s, uint8_t b) const {
  Frame& f = s.back();
  const GrammarNode& n = node(f.node);
  if (f.phase == 0 && f.utf8 == 0 && b != '"' && n.max_length >= 0 && f.count >= n.max_length) {
    return Step::kReject;
  }
  switch (string_byte(f.phase, f.utf8, b)) {
    case StringByte::kReject:
      return Step::kReject;
    case StringByte::kPart:
      return Step::kOk;
    case StringByte::kChar:
      ++f.count;
      return Step::kOk;
    case StringByte::kClose:
      if (f.count < n.min_length) return Step::kReject;
      s.pop_back();
      value_done(s);
      return Step::kOk;
  }
  return Step::kReject;
}

JsonMatcher::Step JsonMatcher::step_key(Stack& s, uint8_t b) const {
  const ByteTrie& trie = grammar_->trie;
  Frame& f = s.back();
  const GrammarNode& object = node(f.node);
  Frame& parent = s[s.size() - 2];
  const StringByte r = string_byte(f.phase, f.utf8, b);
  if (r == StringByte::kReject) return Step::kReject;
  if (r == StringByte::kClose) {
    int32_t property = -1;
    if (f.aux >= 0) property = trie.value(f.aux);
    if (property >= 0 && ((parent.seen >> property) & 1)) return Step::kReject;
    if (property < 0 && object.additional < 0) return Step::kReject;
    s.pop_back();
    parent.phase = kObjectAfterKey;
    parent.aux = property;
    parent.ws = 0;
    if (property >= 0) parent.seen |= uint64_t{1} << property;
    return Step::kOk;
  }
  if (f.aux >= 0) {
    const int32_t c = trie.child(f.aux, b);
    if (c >= 0 && (trie.subtree_values(c) & ~parent.seen) != 0) {
      f.aux = c;
    } else if (object.additional >= 0) {
      f.aux = -1;  // not a listed name (or only written ones): an extra property
    } else {
      return Step::kReject;
    }
  }
  return Step::kOk;
}

JsonMatcher::Step JsonMatcher::step_object(Stack& s, uint8_t b) const {
  Frame& f = s.back();
  const GrammarNode& n = node(f.node);
  if (is_ws(b)) return take_ws(f) ? Step::kOk : Step::kReject;
  switch (f.phase) {
    case kObjectOpen:
    case kObjectNextKey:
      if (b == '"' && can_add_key(n, f.seen)) {
        f.ws = 0;
        s.push_back(make_frame(kKey, f.node, n.key_trie));
        return Step::kOk;
      }
      if (b == '}' && f.phase == kObjectOpen && has_required(n, f.seen)) {
        s.pop_back();
        value_done(s);
        return Step::kOk;
      }
      return Step::kReject;
    case kObjectAfterKey:
      if (b != ':') return Step::kReject;
      f.phase = kObjectInValue;
      f.ws = 0;
      s.push_back(make_frame(
          kValue, f.aux >= 0 ? n.property_nodes[static_cast<size_t>(f.aux)] : n.additional));
      return Step::kOk;
    case kObjectAfterValue:
      if (b == ',' && can_add_key(n, f.seen)) {
        f.phase = kObjectNextKey;
        f.ws = 0;
        return Step::kOk;
      }
      if (b == '}' && has_required(n, f.seen)) {
        s.pop_back();
        value_done(s);
        return Step::kOk;
      }
      return Step::kReject;
    default:
      return Step::kReject;
  }
}

JsonMatcher::Step JsonMatcher::step_array(Stack& s, uint8_t b) const {
  Frame& f = s.back();
  const GrammarNode& n = node(f.node);
  if (is_ws(b)) return take_ws(f) ? Step::kOk : Step::kReject;
  if (f.phase == kArrayOpen) {
    if (b == ']' && n.min_items == 0) {
      s.pop_back();
      value_done(s);
      return Step::kOk;
    }
    if (!can_add_item(n, f.count)) return Step::kReject;
    f.phase = kArrayInItem;
    f.ws = 0;
    s.push_back(make_frame(kValue, item_node(n, f.count)));
    return Step::kRetry;  // b starts the item
  }
  if (f.phase != kArrayAfterItem) return Step::kReject;
  if (b == ',' && can_add_item(n, f.count)) {
    f.phase = kArrayInItem;
    f.ws = 0;
    s.push_back(make_frame(kValue, item_node(n, f.count)));
    return Step::kOk;
  }
  if (b == ']' && f.count >= n.min_items) {
    s.pop_back();
    value_done(s);
    return Step::kOk;
  }
  return Step::kReject;
}

bool JsonMatcher::advance(uint8_t b) {
  if (threads_.size() == 1) {
    const Step r = step(threads_[0], b);
    if (r == Step::kOk) return true;
    if (r == Step::kReject) {
      threads_.clear();
      return false;
    }
  }
  return advance_forking(b);
}

bool JsonMatcher::advance_forking(uint8_t b) {
  std::vector<Stack> work;
  work.swap(threads_);
  threads_.clear();
  while (!work.empty()) {
    Stack t = std::move(work.back());
    work.pop_back();
    const Step r = step(t, b);
    if (r == Step::kOk) {
      if (std::find(threads_.begin(), threads_.end(), t) == threads_.end()) {
        threads_.push_back(std::move(t));
      }
    } else if (r == Step::kFork) {
      for (int32_t alternative : node(t.back().node).alternatives) {
        Stack copy = t;
        copy.back().node = alternative;
        work.push_back(std::move(copy));
      }
    }
  }
  return !threads_.empty();
}

bool JsonMatcher::advance(std::string_view bytes) {
  for (const char ch : bytes) {
    if (!advance(static_cast<uint8_t>(ch))) return false;
  }
  return !dead();
}

bool JsonMatcher::accepting() const {
  for (const Stack& t : threads_) {
    if (t.empty()) return true;
    if (t.size() != 1) continue;
    const Frame& f = t.back();
    if (f.kind == kNumber && number_complete(f.phase)) return true;
    if (f.kind == kLiteral && grammar_->trie.value(f.aux) >= 0) return true;
  }
  return false;
}

int JsonMatcher::plain_string_utf8() const {
  if (threads_.size() != 1 || threads_[0].empty()) return -1;
  const Frame& f = threads_[0].back();
  if (f.phase != 0) return -1;
  if (f.kind == kString && node(f.node).max_length < 0) return f.utf8;
  if (f.kind == kKey && f.aux < 0) return f.utf8;
  return -1;
}

void JsonMatcher::add_plain_string_progress(uint8_t utf8, uint32_t num_chars) {
  Frame& f = threads_[0].back();
  f.utf8 = utf8;
  f.count += num_chars;
}

bool JsonMatcher::finished() const {
  return !threads_.empty() &&
         std::all_of(threads_.begin(), threads_.end(), [](const Stack& t) { return t.empty(); });
}

}  // namespace hyserve
