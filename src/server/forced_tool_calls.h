// Forced tool calls: `tool_choice` "required" or a named function, enforced as vLLM does,
// with guided decoding over the tools' JSON schemas instead of the model's tool-call markers.
//
//   named     the output is the function's arguments: a JSON value following the tool's
//             `parameters` schema; it becomes one call of that name.
//   required  the output is a JSON array of at least one {"name": NAME, "parameters": ARGS}
//             object, NAME one of the tools and ARGS following that tool's schema (keys in
//             either order); each object becomes a call.
//
// forced_tool_call_grammar() compiles the constraint; ForcedToolCallParser turns the
// constrained text into vLLM's tool-call deltas as it streams (and the finished calls). Call
// ids are "functions.NAME:IDX" as the Kimi format writes them, IDX counting the calls of
// earlier assistant turns first (vLLM's kimi_k2 ids). Arguments are the JSON text as
// generated (leading whitespace dropped), so streamed pieces concatenate to the final string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "guided/grammar.h"
#include "tokenizer/tool_call_parser.h"

namespace hyserve {

enum class ForcedToolMode { kNone, kNamed, kRequired };

// The grammar of a forced tool choice over `tools` (the request's array, already checked by
// the protocol parser). `function_name`: kNamed's tool. A tool without `parameters` takes
// none: its arguments are `{}`. Throws RequestError (400) naming the schema keyword
// ("tools[1].function.parameters.properties.x.pattern") outside the supported subset.
Grammar forced_tool_call_grammar(const nlohmann::ordered_json& tools, ForcedToolMode mode,
                                 const std::string& function_name);

class ForcedToolCallParser {
 public:
  // first_id_index: the IDX of this message's first call id (calls in earlier turns).
  ForcedToolCallParser(ForcedToolMode mode, std::string function_name, int32_t first_id_index);

  // Consumes the next piece of constrained text; returns the deltas it completes (a call's
  // first delta carries id and name, the next ones argument text).
  std::vector<ToolCallDelta> feed(std::string_view text);
  // Every call so far: kNamed, the one call once any argument text came; kRequired, each
  // object whose closing brace came.
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  void feed_required(char c, std::vector<ToolCallDelta>& out);
  void end_string(std::vector<ToolCallDelta>& out);
  void end_parameters();
  void end_call();
  // Emits argument text of the current call, its header first once the name is known.
  void emit_arguments(std::string_view text, std::vector<ToolCallDelta>& out);
  // A character of the parameters value outside strings: emitted, and a string or a
  // nesting level opened by it.
  void parameters_char(char c, std::vector<ToolCallDelta>& out);
  std::string call_id(const std::string& name) const;

  ForcedToolMode mode_;
  std::string function_name_;
  int32_t first_id_index_;
  std::vector<ToolCall> calls_;

  // kRequired scanner (the text is valid JSON by construction): nesting depth (1: inside the
  // array, 2: inside a call object, more: inside its parameters), strings, the call's key.
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  enum class Capture { kNone, kKey, kName, kParameters };
  Capture capture_ = Capture::kNone;  // where the bytes being read go
  bool in_parameters_ = false;        // reading the parameters value
  bool scalar_parameters_ = false;    // ... which is a number, boolean or null
  bool expect_value_ = false;         // after a ':' in a call object
  std::string key_;                   // the call object's current key, as written
  std::string name_raw_;              // the "name" value, JSON string text
  std::string name_;                  // ... decoded, once complete
  std::string arguments_;             // the parameters text so far
  std::string pending_;               // argument text not sent yet (the name came later)
  bool header_sent_ = false;
  int32_t index_ = 0;  // the current call's position in this message
};

}  // namespace hyserve
