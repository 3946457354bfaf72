"""Guided decoding: response_format json_object / json_schema, vLLM's guided_json,
guided_choice and structured_outputs, and the 400s for what is not supported.

The bundled model has random weights, so an answer may ramble inside a string until
max_tokens: an output that finished with "stop" must parse and follow the schema; one cut
by "length" must be a prefix of valid JSON (checked by the small parser below)."""

import json

import pytest
import requests

from conftest import NO_THINK, assert_openai_error, start_server

pytestmark = pytest.mark.server

MSG = [{"role": "user", "content": "Give me a JSON answer."}]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "mood": {"enum": ["happy", "sad", None]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Incomplete(Exception):
    """The text ended inside a value: a valid prefix so far."""


def _ws(s, i):
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _need(s, i):
    if i >= len(s):
        raise Incomplete()


def _value(s, i):
    i = _ws(s, i)
    _need(s, i)
    c = s[i]
    if c == "{":
        i = _ws(s, i + 1)
        _need(s, i)
        if s[i] == "}":
            return i + 1
        while True:
            i = _ws(s, i)
            _need(s, i)
            if s[i] != '"':
                raise ValueError(f"key expected at {i}")
            i = _ws(s, _string(s, i))
            _need(s, i)
            if s[i] != ":":
                raise ValueError(f"':' expected at {i}")
            i = _ws(s, _value(s, i + 1))
            _need(s, i)
            if s[i] == "}":
                return i + 1
            if s[i] != ",":
                raise ValueError(f"',' or '}}' expected at {i}")
            i += 1
    if c == "[":
        i = _ws(s, i + 1)
        _need(s, i)
        if s[i] == "]":
            return i + 1
        while True:
            i = _ws(s, _value(s, i))
            _need(s, i)
            if s[i] == "]":
                return i + 1
            if s[i] != ",":
                raise ValueError(f"',' or ']' expected at {i}")
            i += 1
    if c == '"':
        return _string(s, i)
    for word in ("true", "false", "null"):
        if c == word[0]:
            if not word.startswith(s[i:i + len(word)]):
                raise ValueError(f"bad literal at {i}")
            _need(s, i + len(word) - 1)
            return i + len(word)
    if c == "-" or c.isdigit():
        j = i + 1
        while j < len(s) and (s[j].isdigit() or s[j] in ".eE+-"):
            j += 1
        if j == len(s):
            raise Incomplete()
        float(s[i:j])
        return j
    raise ValueError(f"unexpected {c!r} at {i}")


def _string(s, i):
    i += 1
    while True:
        _need(s, i)
        if s[i] == "\\":
            i += 2
        elif s[i] == '"':
            return i + 1
        else:
            if ord(s[i]) < 0x20:
                raise ValueError(f"control character at {i}")
            i += 1


def is_json_prefix(text):
    """True when `text` is a complete JSON value or can still become one."""
    try:
        end = _value(text, 0)
    except Incomplete:
        return True
    except ValueError:
        return False
    return end == len(text)


def check_person(value):
    assert isinstance(value, dict)
    assert set(value) <= set(SCHEMA["properties"]), value
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool)
    if "mood" in value:
        assert value["mood"] in ("happy", "sad", None)
    if "tags" in value:
        assert isinstance(value["tags"], list) and len(value["tags"]) <= 3
        assert all(isinstance(t, bool) for t in value["tags"])


def check_output(text, finish_reason, validate=None):
    if finish_reason == "stop":
        value = json.loads(text)
        if validate:
            validate(value)
        return value
    assert finish_reason == "length", finish_reason
    assert is_json_prefix(text), f"not a JSON prefix: {text!r}"
    return None


def test_prefix_checker_itself():
    for ok in ['{"a": [1, 2', '{"a"', '"abc', "[tru", "-1", '{"a": {"b": null}}', "  {"]:
        assert is_json_prefix(ok), ok
    for bad in ['{"a" 1', "[1,,", "{]", '"a\x01', "nul1", "{} x"]:
        assert not is_json_prefix(bad), bad


def test_json_object_chat(server, client):
    for seed in range(3):
        r = client.chat.completions.create(
            model=server.model, messages=MSG, max_tokens=160, seed=seed,
            response_format={"type": "json_object"}, extra_body=NO_THINK)
        choice = r.choices[0]
        text = choice.message.content
        assert text.lstrip().startswith("{"), text
        value = check_output(text, choice.finish_reason)
        if value is not None:
            assert isinstance(value, dict)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_json_schema_chat(server, client, seed):
    r = client.chat.completions.create(
        model=server.model, messages=MSG, max_tokens=200, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
        extra_body=NO_THINK)
    choice = r.choices[0]
    check_output(choice.message.content, choice.finish_reason, check_person)


def test_json_schema_completions_and_n(server, client):
    r = client.completions.create(
        model=server.model, prompt="JSON:", max_tokens=200, seed=5, n=3,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "p", "schema": SCHEMA}}})
    assert len(r.choices) == 3
    for choice in r.choices:
        check_output(choice.text, choice.finish_reason, check_person)


def test_json_schema_streaming_matches_the_schema(server, client):
    stream = client.chat.completions.create(
        model=server.model, messages=MSG, max_tokens=200, seed=11, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        extra_body=NO_THINK)
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check_output(text, finish, check_person)


def test_guided_json_as_string_and_structured_outputs_json(server):
    small = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    for extra in ({"guided_json": json.dumps(small)}, {"structured_outputs": {"json": small}}):
        body = {"model": server.model, "prompt": "x", "max_tokens": 64, "seed": 3, **extra}
        r = requests.post(server.url("/v1/completions"), json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        value = check_output(choice["text"], choice["finish_reason"])
        if value is not None:
            assert isinstance(value["ok"], bool)


@pytest.mark.parametrize("field", ["guided_choice", "structured_outputs"])
def test_choice_returns_one_choice_exactly(server, client, field):
    choices = ["positive", "negative", "neutral"]
    extra = ({"guided_choice": choices} if field == "guided_choice"
             else {"structured_outputs": {"choice": choices}})
    for seed in range(4):
        r = client.chat.completions.create(
            model=server.model, messages=MSG, max_tokens=32, seed=seed,
            extra_body={**extra, **NO_THINK})
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.content in choices
    r = client.completions.create(model=server.model, prompt="Sentiment:", max_tokens=32,
                                  seed=9, extra_body=extra)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text in choices


def post_chat(server, **fields):
    body = {"model": server.model, "messages": MSG, "max_tokens": 8, **fields}
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=30)


@pytest.mark.parametrize("schema,param", [
    ({"type": "string", "pattern": "^a+$"}, "response_format.json_schema.schema.pattern"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
     "response_format.json_schema.schema.properties.d.format"),
    ({"type": "integer", "minimum": 3}, "response_format.json_schema.schema.minimum"),
    ({"type": "array", "uniqueItems": True}, "response_format.json_schema.schema.uniqueItems"),
])
def test_unsupported_schema_keyword_is_a_400_naming_it(server, schema, param):
    r = post_chat(server, response_format={"type": "json_schema",
                                           "json_schema": {"name": "s", "schema": schema}})
    err = assert_openai_error(r, 400)
    assert err["param"] == param
    assert param.rsplit(".", 1)[1] in err["message"]


@pytest.mark.parametrize("fields,param", [
    ({"guided_regex": "[a-z]+"}, "guided_regex"),
    ({"guided_grammar": "root ::= \"a\""}, "guided_grammar"),
    ({"structured_outputs": {"regex": "a"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "x"}}, "structured_outputs.grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}},
     "response_format.json_schema.schema"),
    ({"guided_json": {"type": "string", "pattern": "x"}}, "guided_json.pattern"),
    ({"guided_choice": []}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice"),
])
def test_unsupported_guided_requests_are_400(server, fields, param):
    err = assert_openai_error(post_chat(server, **fields), 400)
    assert err["param"] == param, err


def test_server_healthy_after_guided_errors(server, client):
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
    r = client.completions.create(model=server.model, prompt="ok", max_tokens=2)
    assert r.usage.completion_tokens >= 1


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("guided-reasoning"),
                       ["--reasoning-parser", "kimi_k3"])
    yield srv
    srv.stop()


def test_with_a_reasoning_parser_the_constraint_starts_after_think_end(reasoning_server):
    srv = reasoning_server
    r = requests.post(srv.url("/tokenize"), json={"prompt": "</think>"}, timeout=10)
    (think_end,) = r.json()["tokens"]
    choices = ["alpha", "beta"]
    body = {"model": srv.model, "messages": MSG, "max_tokens": 24, "seed": 1,
            "guided_choice": choices}
    # Thinking off: the answer is constrained from its first token.
    r = requests.post(srv.url("/v1/chat/completions"), json={**body, **NO_THINK}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in choices
    # Thinking on: nothing is constrained until </think> (forced here by a logit bias);
    # what follows it is.
    r = requests.post(srv.url("/v1/chat/completions"),
                      json={**body, "logit_bias": {str(think_end): 100}}, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] in choices

