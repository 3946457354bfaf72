#include "tokenizer/parser_registry.h"

#include "tokenizer/deepseek_v32_tool_parser.h"
#include "tokenizer/kimi_k3_tool_parser.h"
#include "util/error.h"

namespace hyserve {

bool is_tool_call_parser_name(std::string_view name) {
  return name == "kimi_k3" || name == "deepseek_v32";
}

bool is_reasoning_parser_name(std::string_view name) {
  return name == "kimi_k3" || name == "deepseek_v3";
}

std::unique_ptr<ToolCallStreamParser> make_tool_call_parser(std::string_view name) {
  if (name == "kimi_k3") return std::make_unique<KimiToolCallStreamParser>();
  if (name == "deepseek_v32") return std::make_unique<DeepSeekV32ToolCallStreamParser>();
  HYSERVE_THROW(InvalidArgument, "unknown tool-call parser '", name, "'");
}

ReasoningStreamParser make_reasoning_parser(std::string_view name, bool thinking_enabled) {
  if (name == "kimi_k3") return ReasoningStreamParser(thinking_enabled, kToolCallsSectionBegin);
  if (name == "deepseek_v3") return ReasoningStreamParser(thinking_enabled, "");
  HYSERVE_THROW(InvalidArgument, "unknown reasoning parser '", name, "'");
}

}  // namespace hyserve
