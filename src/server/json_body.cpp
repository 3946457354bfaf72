// Request bodies as JSON; see json_body.h.
#include "server/json_body.h"

#include <vector>

namespace hyserve {
namespace {

using nlohmann::ordered_json;

// Finds where a JSON text stops parsing, as a path ("messages[0].content"): a SAX pass that
// keeps the stack of keys and array indices. Run only when the DOM parse failed.
class JsonErrorLocator {
 public:
  using number_integer_t = ordered_json::number_integer_t;
  using number_unsigned_t = ordered_json::number_unsigned_t;
  using number_float_t = ordered_json::number_float_t;
  using string_t = ordered_json::string_t;
  using binary_t = ordered_json::binary_t;

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(number_integer_t) { return value(); }
  bool number_unsigned(number_unsigned_t) { return value(); }
  bool number_float(number_float_t, const string_t&) { return value(); }
  bool string(string_t&) { return value(); }
  bool binary(binary_t&) { return value(); }
  bool start_object(std::size_t) {
    frames_.push_back({false, 0, ""});
    return true;
  }
  bool key(string_t& key) {
    // Client text goes into the error message: long keys are cut.
    frames_.back().key = key.size() > kMaxKeyBytes ? key.substr(0, kMaxKeyBytes) + "..." : key;
    return true;
  }
  bool start_array(std::size_t) {
    frames_.push_back({true, 0, ""});
    return true;
  }
  bool end_object() { return end(); }
  bool end_array() { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }

  // The path of the value being parsed when parsing stopped.
  std::string path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.array) {
        out += str_cat("[", f.index, "]");
      } else {
        out += (out.empty() ? "" : ".") + f.key;
      }
    }
    return out;
  }

 private:
  static constexpr size_t kMaxKeyBytes = 64;
  struct Frame {
    bool array;
    size_t index;  // arrays: values completed so far
    std::string key;
  };
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool end() {
    frames_.pop_back();
    return value();
  }
  std::vector<Frame> frames_;
};

}  // namespace

ordered_json parse_json_body(std::string_view body) {
  constexpr size_t kMaxMessageBytes = 200;
  try {
    return ordered_json::parse(body);
  } catch (const ordered_json::out_of_range&) {
    JsonErrorLocator locator;
    ordered_json::sax_parse(body, &locator);
    const std::string path = locator.path();
    throw RequestError(path, path.empty()
                                 ? "Invalid JSON body: a number is out of range (beyond a double)"
                                 : str_cat("Invalid JSON body: the number at '", path,
                                           "' is out of range (beyond a double)"));
  } catch (const ordered_json::exception& e) {
    std::string what = e.what();
    if (const size_t end = what.find("] "); what.starts_with("[json.") && end != what.npos) {
      what.erase(0, end + 2);
    }
    if (what.size() > kMaxMessageBytes) what = what.substr(0, kMaxMessageBytes) + "...";
    throw RequestError("", str_cat("Invalid JSON body: ", what));
  }
}

BodyReader::BodyReader(std::string_view body) : body_(parse_json_body(body)) {
  if (!body_.is_object()) throw RequestError("", "Request body must be a JSON object");
}

const ordered_json* BodyReader::get(std::string_view key) {
  known_.emplace(key);
  const auto it = body_.find(key);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::vector<std::string> BodyReader::unknown_fields() const {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : body_.items()) {
    if (!known_.count(key)) unknown.push_back(key);
  }
  return unknown;
}

}  // namespace hyserve
