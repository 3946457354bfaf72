"""Tool calls and reasoning end to end, through the real binary and the `openai` SDK.

The model is tests/fixtures/scripted-kimi-k3 (built by tools/make_scripted_model.py): after
the chat prompt's last token (<think>) greedy decoding emits one fixed reply,

    The user would like the weather in Paris</think>
    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
    <|im_end|>

(scripted_reply.json holds its token ids). The server runs with vLLM's flags
--enable-auto-tool-choice --tool-call-parser kimi_k3 --reasoning-parser kimi_k3, so the
reply must come back as `reasoning` plus one tool call, finish_reason "tool_calls", with no
content, streamed or not.
"""

import json

import pytest
import requests

from conftest import REPO_ROOT, REQUEST_TIMEOUT_S, start_server

pytestmark = pytest.mark.server

SCRIPTED_DIR = REPO_ROOT / "tests" / "fixtures" / "scripted-kimi-k3"
REPLY = json.loads((SCRIPTED_DIR / "scripted_reply.json").read_text())
ARGUMENTS = {"city": "Paris"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "city name"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# Greedy, with room for the whole reply: it ends at <|im_end|>, not at max_tokens.
GREEDY = {"temperature": 0, "max_tokens": 64}


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("tool_calls"),
                       ["--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3",
                        "--reasoning-parser", "kimi_k3"],
                       model_dir=SCRIPTED_DIR)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tool_client(tool_server):
    return tool_server.client()


def create(srv, client, messages=QUESTION, **extra):
    return client.chat.completions.create(model=srv.model, messages=messages,
                                          tools=[WEATHER_TOOL], **GREEDY, **extra)


def count_prompt_tokens(srv, messages, **extra):
    """The chat prompt's length as POST /tokenize counts it, tools declared."""
    r = requests.post(srv.url("/tokenize"), json={"model": srv.model, "messages": messages,
                                                  "tools": [WEATHER_TOOL], **extra}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    return r.json()["count"]


def reasoning_of(obj):
    """The server's `reasoning` field of a message or delta (an extra field to the SDK)."""
    return (obj.model_extra or {}).get("reasoning")


def test_fixture_reply_decodes_and_follows_the_prompt(tool_server):
    r = requests.post(tool_server.url("/detokenize"),
                      json={"model": tool_server.model, "tokens": REPLY["reply_token_ids"]},
                      timeout=10)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["prompt"] == REPLY["reply_text"]
    # The chain starts at the generation prompt's last token.
    r = requests.post(tool_server.url("/tokenize"),
                      json={"model": tool_server.model, "messages": QUESTION}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["tokens"][-1] == REPLY["trigger_token_id"]


def test_tool_call_with_reasoning(tool_server, tool_client):
    response = create(tool_server, tool_client)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    message = choice.message
    assert message.role == "assistant"
    assert message.content in (None, ""), f"content should be empty: {message.content!r}"
    assert reasoning_of(message) == REPLY["reasoning"]
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.id == "functions.get_weather:0"
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS
    assert call.function.arguments == REPLY["arguments"]  # as generated, not re-serialized
    usage = response.usage
    assert usage.prompt_tokens == count_prompt_tokens(tool_server, QUESTION)
    assert usage.completion_tokens == len(REPLY["reply_token_ids"])  # <|im_end|> counts
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_tool_call_with_reasoning(tool_server, tool_client):
    reference = create(tool_server, tool_client)
    stream = create(tool_server, tool_client, stream=True,
                    stream_options={"include_usage": True})
    reasoning, content = "", ""
    arguments = {}  # call index -> its argument pieces, joined
    finish_reasons, usage, ids = [], None, set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
            continue
        for choice in chunk.choices:
            delta = choice.delta
            reasoning += reasoning_of(delta) or ""
            content += delta.content or ""
            for piece in delta.tool_calls or []:
                if piece.index not in arguments:
                    # The first delta of a call names it.
                    assert piece.id == "functions.get_weather:0"
                    assert piece.type == "function"
                    assert piece.function.name == "get_weather"
                    arguments[piece.index] = ""
                else:
                    assert piece.id is None and piece.function.name is None, piece
                arguments[piece.index] += piece.function.arguments or ""
            if choice.finish_reason is not None:
                finish_reasons.append(choice.finish_reason)
    assert len(ids) == 1
    assert reasoning == REPLY["reasoning"]
    assert content == ""
    assert list(arguments) == [0]
    assert arguments[0] == REPLY["arguments"]
    assert json.loads(arguments[0]) == ARGUMENTS
    assert finish_reasons == ["tool_calls"]
    assert usage is not None
    assert usage.completion_tokens == len(REPLY["reply_token_ids"])
    assert usage.prompt_tokens == reference.usage.prompt_tokens == count_prompt_tokens(
        tool_server, QUESTION)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_thinking_off_gives_the_tool_call_without_reasoning(tool_server, tool_client):
    response = create(tool_server, tool_client,
                      extra_body={"chat_template_kwargs": {"thinking": False}})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not reasoning_of(choice.message)
    assert choice.message.content in (None, "")
    assert [c.id for c in choice.message.tool_calls] == ["functions.get_weather:0"]
    assert json.loads(choice.message.tool_calls[0].function.arguments) == ARGUMENTS
    assert response.usage.completion_tokens == len(REPLY["no_thinking_reply_token_ids"])
    assert response.usage.prompt_tokens == count_prompt_tokens(
        tool_server, QUESTION, chat_template_kwargs={"thinking": False})


def test_tool_result_turn_renders(tool_server, tool_client):
    first = create(tool_server, tool_client).choices[0].message
    call = first.tool_calls[0]
    messages = QUESTION + [
        {"role": "assistant", "content": first.content, "reasoning_content": reasoning_of(first),
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name,
                                      "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "name": "get_weather",
         "content": '{"temperature_c": 18, "sky": "clear"}'},
    ]
    raw = tool_client.chat.completions.with_raw_response.create(
        model=tool_server.model, messages=messages, tools=[WEATHER_TOOL], **GREEDY)
    assert raw.http_response.status_code == 200
    # The scripted model answers every prompt ending in <think> the same way.
    second = raw.parse()
    assert second.choices[0].finish_reason == "tool_calls"
    assert second.usage.prompt_tokens == count_prompt_tokens(tool_server, messages)
    # The history renders as the template says: the call and its result are in the prompt.
    r = requests.post(tool_server.url("/tokenize"),
                      json={"model": tool_server.model, "messages": messages,
                            "tools": [WEATHER_TOOL]}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    r = requests.post(tool_server.url("/detokenize"),
                      json={"model": tool_server.model, "tokens": r.json()["tokens"]},
                      timeout=REQUEST_TIMEOUT_S)
    prompt = r.json()["prompt"]
    assert prompt.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert ("<think>The user would like the weather in Paris</think>"
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
            "<|tool_calls_section_end|><|im_end|>") in prompt
    assert ("<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n"
            '{"temperature_c": 18, "sky": "clear"}<|im_end|>') in prompt
