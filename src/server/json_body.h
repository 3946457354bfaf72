// Request bodies as JSON: parsed into nlohmann::ordered_json with a 400 (RequestError) for
// bad JSON, and read field by field so the fields nobody read can be listed.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"

namespace hyserve {

// Parses a request body. Bad JSON is a RequestError whose message never quotes the body at
// length: a number beyond a double's range (1e999, a 5000-digit integer) is named by its
// path as the param ("messages[0].x[1]"), a syntax error by nlohmann's position text, cut
// short.
nlohmann::ordered_json parse_json_body(std::string_view body);

// A JSON object body; each field read is marked known, the rest are listed. A JSON null is
// an absent field (vLLM's pydantic models treat it so), except for sent().
class BodyReader {
 public:
  // Throws RequestError for bad JSON and for a body that is not an object.
  explicit BodyReader(std::string_view body);

  // The field's value, or nullptr when absent or null.
  const nlohmann::ordered_json* get(std::string_view key);
  // Whether the field was sent at all, null included.
  bool sent(std::string_view key) const { return body_.find(key) != body_.end(); }
  std::vector<std::string> unknown_fields() const;

 private:
  nlohmann::ordered_json body_;
  std::set<std::string, std::less<>> known_;
};

}  // namespace hyserve
