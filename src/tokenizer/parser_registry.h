// The output parser names hyserve takes (vLLM's): `--tool-call-parser kimi_k3|deepseek_v32`
// and `--reasoning-parser kimi_k3|deepseek_v3`, and the parsers they make.
#pragma once

#include <memory>
#include <string_view>

#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"

namespace hyserve {

bool is_tool_call_parser_name(std::string_view name);
bool is_reasoning_parser_name(std::string_view name);

// Throws InvalidArgument for a name is_tool_call_parser_name refuses.
std::unique_ptr<ToolCallStreamParser> make_tool_call_parser(std::string_view name);

// kimi_k3: reasoning also ends at Kimi's tool-call section; deepseek_v3: only at </think>
// (vLLM's DeepSeek-R1 parser, which its deepseek_v3 parser runs in thinking mode; with
// thinking off every byte is content, as its identity parser). Throws InvalidArgument for a
// name is_reasoning_parser_name refuses.
ReasoningStreamParser make_reasoning_parser(std::string_view name, bool thinking_enabled);

}  // namespace hyserve
