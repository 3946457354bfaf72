"""tool_choice "required" and a named function force a tool call (issue 25, item 4), as vLLM
does: generation is constrained to the tools' JSON schemas by guided decoding, without
--enable-auto-tool-choice.

The bundled model has random weights. The tools' arguments are enums, so a named call is
complete within a few tokens and then only EOS may follow; for "required" a logit bias on
"]" closes the array after its first call."""

import json

import pytest
import requests

from conftest import NO_THINK, REPO_ROOT, assert_openai_error, start_server

pytestmark = pytest.mark.server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
UNITS = {
    "type": "function",
    "function": {
        "name": "set_units",
        "parameters": {
            "type": "object",
            "properties": {"metric": {"type": "boolean"}},
            "required": ["metric"],
            "additionalProperties": False,
        },
    },
}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters: `{}`
TOOLS = [WEATHER, UNITS, PING]
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
VALID_ARGUMENTS = {
    "get_weather": [{"city": "Paris"}, {"city": "Rome"}],
    "set_units": [{"metric": True}, {"metric": False}],
    "ping": [{}],
}


def named(name):
    return {"type": "function", "function": {"name": name}}


def close_bracket_bias(server):
    r = requests.post(server.url("/tokenize"), json={"prompt": "]"}, timeout=10)
    (token,) = r.json()["tokens"]
    return {str(token): 100}


def check_call(call, index=0):
    assert call.type == "function"
    assert call.function.name in VALID_ARGUMENTS
    assert call.id == f"functions.{call.function.name}:{index}"
    assert json.loads(call.function.arguments) in VALID_ARGUMENTS[call.function.name]


@pytest.mark.parametrize("name", ["get_weather", "set_units", "ping"])
@pytest.mark.parametrize("seed", [0, 1])
def test_named_function_is_called_with_schema_arguments(server, client, name, seed):
    r = client.chat.completions.create(model=server.model, messages=MSG, tools=TOOLS,
                                       tool_choice=named(name), max_tokens=64, seed=seed,
                                       extra_body=NO_THINK)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # vLLM and OpenAI: "stop" for a named function
    assert choice.message.content in (None, "")
    (call,) = choice.message.tool_calls
    assert call.function.name == name
    check_call(call)


def test_required_gives_calls_of_the_tools(server, client):
    for seed in range(3):
        r = client.chat.completions.create(model=server.model, messages=MSG, tools=TOOLS,
                                           tool_choice="required", max_tokens=64, seed=seed,
                                           logit_bias=close_bracket_bias(server),
                                           extra_body=NO_THINK)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content in (None, "")
        assert len(choice.message.tool_calls) >= 1
        for i, call in enumerate(choice.message.tool_calls):
            check_call(call, i)


def test_required_without_a_bias_still_calls_or_runs_out_of_tokens(server, client):
    r = client.chat.completions.create(model=server.model, messages=MSG, tools=[WEATHER],
                                       tool_choice="required", max_tokens=120, seed=3,
                                       extra_body=NO_THINK)
    choice = r.choices[0]
    assert choice.finish_reason in ("tool_calls", "length")
    # Every complete object of the array is a call; the one cut by max_tokens is dropped.
    assert choice.message.tool_calls
    for i, call in enumerate(choice.message.tool_calls):
        check_call(call, i)


def test_call_ids_continue_the_conversation(server, client):
    history = MSG + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
        {"role": "user", "content": "And Paris?"},
    ]
    r = client.chat.completions.create(model=server.model, messages=history, tools=TOOLS,
                                       tool_choice=named("get_weather"), max_tokens=64, seed=0,
                                       extra_body=NO_THINK)
    (call,) = r.choices[0].message.tool_calls
    assert call.id == "functions.get_weather:1"


def collect_stream(stream):
    calls, content, finish = {}, "", []
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                if piece.index not in calls:
                    # The first delta of a call names it.
                    assert piece.id and piece.type == "function" and piece.function.name
                    calls[piece.index] = {"id": piece.id, "name": piece.function.name,
                                          "arguments": ""}
                else:
                    assert piece.id is None and piece.function.name is None, piece
                calls[piece.index]["arguments"] += piece.function.arguments or ""
            if choice.finish_reason is not None:
                finish.append(choice.finish_reason)
    return [calls[i] for i in sorted(calls)], content, finish


@pytest.mark.parametrize("tool_choice", ["required", named("get_weather")])
def test_streamed_calls_equal_the_full_response(server, client, tool_choice):
    body = dict(model=server.model, messages=MSG, tools=TOOLS, tool_choice=tool_choice,
                max_tokens=64, seed=5, logit_bias=close_bracket_bias(server),
                extra_body=NO_THINK)
    full = client.chat.completions.create(**body).choices[0]
    calls, content, finish = collect_stream(client.chat.completions.create(stream=True, **body))
    assert content == ""
    assert finish == [full.finish_reason]
    assert finish == (["tool_calls"] if tool_choice == "required" else ["stop"])
    assert calls == [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in full.message.tool_calls]
    assert calls


def test_n_choices_each_call(server, client):
    r = client.chat.completions.create(model=server.model, messages=MSG, tools=TOOLS,
                                       tool_choice=named("set_units"), max_tokens=64, seed=2,
                                       n=3, extra_body=NO_THINK)
    assert len(r.choices) == 3
    for choice in r.choices:
        (call,) = choice.message.tool_calls
        check_call(call)


def test_forced_tool_choice_replaces_response_format(server, client):
    r = client.chat.completions.create(model=server.model, messages=MSG, tools=TOOLS,
                                       tool_choice=named("get_weather"), max_tokens=64, seed=0,
                                       response_format={"type": "json_object"},
                                       extra_body=NO_THINK)
    (call,) = r.choices[0].message.tool_calls
    check_call(call)


@pytest.mark.parametrize("tool_choice", ["required", named("bad")])
def test_unsupported_parameter_schema_is_a_400_naming_it(server, tool_choice):
    bad = {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "^a+$"}}}}}
    r = requests.post(server.url("/v1/chat/completions"),
                      json={"model": server.model, "messages": MSG, "tools": [WEATHER, bad],
                            "tool_choice": tool_choice, "max_tokens": 8}, timeout=30)
    error = assert_openai_error(r, 400)
    assert error["param"] == "tools[1].function.parameters.properties.x.pattern"


def test_named_schema_of_other_tools_is_not_compiled(server, client):
    bad = {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "format": "email"}}}}}
    r = client.chat.completions.create(model=server.model, messages=MSG, tools=[WEATHER, bad],
                                       tool_choice=named("get_weather"), max_tokens=64, seed=0,
                                       extra_body=NO_THINK)
    check_call(r.choices[0].message.tool_calls[0])


SCRIPTED_DIR = REPO_ROOT / "tests" / "fixtures" / "scripted-kimi-k3"


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("forced-tools"),
                       ["--reasoning-parser", "kimi_k3"], model_dir=SCRIPTED_DIR)
    yield srv
    srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_with_a_reasoning_parser_the_call_follows_the_reasoning(reasoning_server, stream):
    """The scripted model reasons, then (its tool-call markers masked) writes the forced
    call: the constraint starts after </think>."""
    reply = json.loads((SCRIPTED_DIR / "scripted_reply.json").read_text())
    srv = reasoning_server
    client = srv.client()
    body = dict(model=srv.model, messages=MSG, tools=[WEATHER],
                tool_choice=named("get_weather"), temperature=0, max_tokens=96)
    if not stream:
        choice = client.chat.completions.create(**body).choices[0]
        assert (choice.message.model_extra or {}).get("reasoning") == reply["reasoning"]
        assert choice.finish_reason == "stop"
        (call,) = choice.message.tool_calls
        check_call(call)
        return
    reasoning = ""
    chunks = list(client.chat.completions.create(stream=True, **body))
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning") or ""
    calls, content, finish = collect_stream(chunks)
    assert reasoning == reply["reasoning"]
    assert content == ""
    assert finish == ["stop"]
    (call,) = calls
    assert call["name"] == "get_weather" and call["id"] == "functions.get_weather:0"
    assert json.loads(call["arguments"]) in VALID_ARGUMENTS["get_weather"]
