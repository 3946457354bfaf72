"""Request fields as vLLM treats them (issue 25): numbers beyond a double, tools without
--enable-auto-tool-choice, /v1/completions' default max_tokens, return_tokens_as_token_ids,
chat echo (with continue_final_message), suffix, best_of, continuous usage stats,
X-Request-Id, the developer role and the empty prompt's one error text; vLLM's
allowed_token_ids and truncate_prompt_tokens; unknown fields ignored with a log line."""

import json
import re
import threading

import openai
import pytest
import requests

from conftest import NO_THINK, REQUEST_TIMEOUT_S, assert_openai_error

pytestmark = pytest.mark.server

JSON = {"Content-Type": "application/json"}
TOOL = {"type": "function",
        "function": {"name": "get_weather", "description": "Weather of a city",
                     "parameters": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}}
USER = [{"role": "user", "content": "Tell me a story."}]


def post(server, route, body, headers=None):
    return requests.post(server.url(route), json=body, headers=headers,
                         timeout=REQUEST_TIMEOUT_S)


def sse_events(response):
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


# ---- Item 3: a number beyond a double -----------------------------------------------------

BIG_INTEGER = "9" * 5000


@pytest.mark.parametrize("number", ["1e999", "-1e999", BIG_INTEGER])
def test_number_beyond_a_double_is_a_400_naming_the_field(server, number):
    cases = [
        ("/v1/completions", '{"prompt": "hi", "max_tokens": 1, "foo": %s}', "foo"),
        ("/v1/chat/completions",
         '{"messages": [{"role": "user", "content": "hi", "x": [0, %s]}]}', "messages[0].x[1]"),
        ("/tokenize", '{"prompt": "hi", "n": {"deep": %s}}', "n.deep"),
        ("/detokenize", '{"tokens": [1, %s]}', "tokens[1]"),
    ]
    for route, body, param in cases:
        r = requests.post(server.url(route), data=body % number, headers=JSON, timeout=30)
        error = assert_openai_error(r, 400)
        assert error["param"] == param, (route, error)
        assert "out of range" in error["message"], error
        assert number not in error["message"], error
    # Nothing of the number reached the log, and the server still serves.
    log = server.log_path.read_text(errors="replace")
    assert "9" * 50 not in log
    # As a number standing alone: a request id's random hex may hold the digits "1e999".
    assert not re.search(r"(?<![0-9A-Za-z])1e999", log)
    r = post(server, "/v1/completions", {"prompt": "ok", "max_tokens": 1})
    assert r.status_code == 200, r.text[:300]


# ---- Item 5: tools with "auto" need --enable-auto-tool-choice ------------------------------

def test_tools_with_auto_tool_choice_need_the_server_flag(server, client):
    # The shared server runs without --enable-auto-tool-choice: "auto", the default once
    # tools are given, is refused as vLLM refuses it.
    for extra in ({}, {"tool_choice": "auto"}):
        r = post(server, "/v1/chat/completions",
                 {"messages": USER, "tools": [TOOL], "max_tokens": 2, **extra})
        error = assert_openai_error(r, 400)
        assert error["param"] == "tool_choice", error
        assert error["message"] == ('"auto" tool choice requires --enable-auto-tool-choice and '
                                    '--tool-call-parser to be set'), error
    with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
        client.chat.completions.create(model=server.model, messages=USER, tools=[TOOL],
                                       max_tokens=2)
    # "none" keeps the tools out of the output: no parser needed.
    r = post(server, "/v1/chat/completions",
             {"messages": USER, "tools": [TOOL], "tool_choice": "none", "max_tokens": 2})
    assert r.status_code == 200, r.text[:300]


# ---- Item 6: /v1/completions defaults to 16 tokens -----------------------------------------

def test_completions_without_max_tokens_generate_16(server, client):
    r = client.completions.create(model=server.model, prompt="Once upon a time",
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_completions_with_null_max_tokens_run_to_the_context_end(server):
    # vLLM: an explicit null means no limit but the context.
    left = 40
    r = post(server, "/v1/completions",
             {"prompt": [300] * (server.max_model_len - left), "max_tokens": None,
              "ignore_eos": True})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == left


# ---- Item 12: return_tokens_as_token_ids, chat echo, suffix, best_of, usage, ids, roles ----

def test_return_tokens_as_token_ids_in_logprobs(server):
    r = post(server, "/v1/completions",
             {"prompt": "Hello", "max_tokens": 4, "logprobs": 2, "ignore_eos": True,
              "return_tokens_as_token_ids": True, "return_token_ids": True})
    assert r.status_code == 200, r.text[:300]
    choice = r.json()["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    for top in choice["logprobs"]["top_logprobs"]:
        assert all(re.fullmatch(r"token_id:\d+", k) for k in top), top
    r = post(server, "/v1/chat/completions",
             {"messages": USER, "max_tokens": 4, "logprobs": True, "top_logprobs": 2,
              "ignore_eos": True, "return_tokens_as_token_ids": True, "return_token_ids": True,
              **NO_THINK})
    assert r.status_code == 200, r.text[:300]
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(re.fullmatch(r"token_id:\d+", alt["token"])
               for c in content for alt in c["top_logprobs"])


def test_return_token_ids_match_the_text(server):
    # logit_bias makes the output known: token 500, five times.
    r = post(server, "/v1/completions",
             {"prompt": [300, 301, 302], "max_tokens": 5, "ignore_eos": True,
              "logit_bias": {"500": 100}, "return_token_ids": True})
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == [300, 301, 302]
    assert choice["token_ids"] == [500] * 5
    text = post(server, "/detokenize", {"tokens": choice["token_ids"]}).json()["prompt"]
    assert text == choice["text"]
    with requests.post(server.url("/v1/completions"),
                       json={"prompt": [300, 301], "max_tokens": 3, "ignore_eos": True,
                             "logit_bias": {"500": 100}, "return_token_ids": True,
                             "stream": True}, stream=True, timeout=REQUEST_TIMEOUT_S) as r:
        events = sse_events(r)
    assert events[0]["choices"][0]["prompt_token_ids"] == [300, 301]
    assert all("prompt_token_ids" not in e["choices"][0] for e in events[1:])
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == [500] * 3


PREFILL = [{"role": "user", "content": "Tell me a story."},
           {"role": "assistant", "content": "Once upon a time, in Paris,"}]


def test_chat_echo_starts_with_the_continued_message(server, client):
    prefix = PREFILL[-1]["content"]
    body = {"messages": PREFILL, "max_tokens": 4, "ignore_eos": True, "temperature": 0,
            "continue_final_message": True, **NO_THINK}
    echoed = post(server, "/v1/chat/completions", {**body, "echo": True}).json()
    plain = post(server, "/v1/chat/completions", body).json()
    message = echoed["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == prefix + plain["choices"][0]["message"]["content"]
    assert not plain["choices"][0]["message"]["content"].startswith(prefix)
    # The prompt ends inside the assistant turn: what /tokenize counts for the same request,
    # and its text ends with the message's content.
    tok = post(server, "/tokenize", {"messages": PREFILL, "continue_final_message": True,
                                     **NO_THINK}).json()
    assert plain["usage"]["prompt_tokens"] == tok["count"]
    text = post(server, "/detokenize", {"tokens": tok["tokens"]}).json()["prompt"]
    assert text.endswith(prefix)
    # Streaming: the echo is the first content after the role chunk.
    stream = client.chat.completions.create(model=server.model, messages=PREFILL, max_tokens=4,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True, "echo": True,
                                                        "continue_final_message": True,
                                                        **NO_THINK})
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == message["content"]
    # The last message is the user's: nothing to echo for an assistant reply.
    r = post(server, "/v1/chat/completions",
             {"messages": USER, "max_tokens": 2, "echo": True, **NO_THINK})
    assert not r.json()["choices"][0]["message"]["content"].startswith(USER[0]["content"])
    both = post(server, "/v1/chat/completions",
                {**body, "add_generation_prompt": True})
    assert assert_openai_error(both, 400)["param"] == "continue_final_message"


def test_suffix_is_refused(server, client):
    with pytest.raises(openai.BadRequestError, match="suffix is not currently supported"):
        client.completions.create(model=server.model, prompt="def f(", suffix="return 1",
                                  max_tokens=2)
    r = post(server, "/v1/completions", {"prompt": "x", "suffix": "", "max_tokens": 1})
    assert assert_openai_error(r, 400)["param"] == "suffix"


def test_best_of_equal_to_n_only(server, client):
    r = client.completions.create(model=server.model, prompt="hi", max_tokens=2, n=2, best_of=2)
    assert len(r.choices) == 2
    for best_of, n in ((3, 1), (4, 2), (1, 2)):
        r = post(server, "/v1/completions",
                 {"prompt": "hi", "max_tokens": 2, "n": n, "best_of": best_of})
        assert assert_openai_error(r, 400)["param"] == "best_of"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_continuous_usage_stats_on_every_chunk(server, route):
    body = {"max_tokens": 5, "ignore_eos": True, "stream": True, "n": 2,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"messages": USER, **NO_THINK} if "chat" in route else {"prompt": "Once"})
    with requests.post(server.url(route), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        events = sse_events(r)
    chunks = [e for e in events if e["choices"]]
    assert chunks and all("usage" in e for e in chunks), events
    per_choice = {}
    for e in chunks:
        index = e["choices"][0]["index"]
        tokens = e["usage"]["completion_tokens"]
        assert tokens >= per_choice.get(index, 0)
        assert e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + tokens
        per_choice[index] = tokens
    assert per_choice == {0: 5, 1: 5}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 10
    # Without continuous_usage_stats only the closing chunk has usage.
    body["stream_options"] = {"include_usage": True}
    with requests.post(server.url(route), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        events = sse_events(r)
    assert [e for e in events if e.get("usage")] == events[-1:]


def test_x_request_id_is_echoed_and_names_the_request(server):
    for route, prefix, body in (("/v1/chat/completions", "chatcmpl", {"messages": USER}),
                                ("/v1/completions", "cmpl", {"prompt": "hi"})):
        r = post(server, route, {**body, "max_tokens": 2}, headers={"X-Request-Id": "trace-42"})
        assert r.status_code == 200, r.text[:300]
        assert r.headers["X-Request-Id"] == "trace-42"
        assert r.json()["id"] == f"{prefix}-trace-42"
    with requests.post(server.url("/v1/completions"),
                       json={"prompt": "hi", "max_tokens": 2, "stream": True},
                       headers={"X-Request-Id": "trace-43"}, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        assert r.headers["X-Request-Id"] == "trace-43"
        assert all(e["id"] == "cmpl-trace-43" for e in sse_events(r))
    # Other routes and errors echo it too; without it a fresh id is made.
    assert requests.get(server.url("/health"), headers={"X-Request-Id": "h1"},
                        timeout=10).headers["X-Request-Id"] == "h1"
    bad = post(server, "/v1/completions", {"prompt": ""}, headers={"X-Request-Id": "e1"})
    assert bad.status_code == 400 and bad.headers["X-Request-Id"] == "e1"
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
    assert "X-Request-Id" not in r.headers
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", r.json()["id"])


def test_one_x_request_id_on_concurrent_requests(server):
    # Clients reuse ids; each request still runs on its own.
    results = []

    def one():
        r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 8, "ignore_eos": True},
                 headers={"X-Request-Id": "same"})
        results.append((r.status_code, r.json().get("usage", {}).get("completion_tokens")))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=REQUEST_TIMEOUT_S)
    assert results == [(200, 8)] * 4


def test_developer_role_is_the_system_turn(server):
    def tokens(role):
        r = post(server, "/tokenize",
                 {"messages": [{"role": role, "content": "Be brief."}, *USER]})
        assert r.status_code == 200, r.text[:300]
        return r.json()["tokens"]

    assert tokens("developer") == tokens("system")
    r = post(server, "/v1/chat/completions",
             {"messages": [{"role": "developer", "content": "Be brief."}, *USER],
              "max_tokens": 2})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["prompt_tokens"] == len(tokens("system"))


def test_empty_prompts_share_one_error(server):
    messages = set()
    for prompt in ("", [], [[]], [""], ["a", ""], [[1], []]):
        r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        error = assert_openai_error(r, 400)
        assert error["param"] == "prompt", (prompt, error)
        messages.add(error["message"])
    assert messages == {"The prompt is empty."}


# ---- vLLM's allowed_token_ids, truncate_prompt_tokens; unknown fields ------------------------

def test_allowed_token_ids_are_the_only_tokens_sampled(server):
    allowed = [300, 301, 777]
    for route, body in (("/v1/completions", {"prompt": "Once upon a time"}),
                        ("/v1/chat/completions", {"messages": USER, **NO_THINK})):
        r = post(server, route, {**body, "max_tokens": 12, "ignore_eos": True, "seed": 3,
                                 "temperature": 1.5, "allowed_token_ids": allowed,
                                 "return_token_ids": True})
        assert r.status_code == 200, r.text[:500]
        ids = r.json()["choices"][0]["token_ids"]
        assert len(ids) == 12 and set(ids) <= set(allowed), ids
        assert len(set(ids)) > 1  # sampled among them, not one forced id
    # With greedy decoding and a bias toward another id: still only the allowed ones.
    r = post(server, "/v1/completions",
             {"prompt": [300, 301], "max_tokens": 4, "ignore_eos": True, "temperature": 0,
              "logit_bias": {"500": 100}, "allowed_token_ids": [42], "return_token_ids": True})
    assert r.json()["choices"][0]["token_ids"] == [42] * 4
    for bad in ([], [10 ** 8], [-1]):
        error = assert_openai_error(
            post(server, "/v1/completions",
                 {"prompt": "hi", "max_tokens": 2, "allowed_token_ids": bad}), 400)
        assert error["param"] == "allowed_token_ids", error


def test_truncate_prompt_tokens_keeps_the_prompts_end(server):
    prompt = [300, 301, 302, 303, 304, 305, 306, 307, 308, 309]
    body = {"max_tokens": 3, "ignore_eos": True, "temperature": 0, "return_token_ids": True}
    cut = post(server, "/v1/completions",
               {**body, "prompt": prompt, "truncate_prompt_tokens": 4}).json()
    tail = post(server, "/v1/completions", {**body, "prompt": prompt[-4:]}).json()
    assert cut["usage"]["prompt_tokens"] == 4
    assert cut["choices"][0]["prompt_token_ids"] == prompt[-4:]
    assert cut["choices"][0]["token_ids"] == tail["choices"][0]["token_ids"]
    # Echo gives the text of the ids the model read.
    echoed = post(server, "/v1/completions",
                  {**body, "prompt": "one two three four five six seven", "echo": True,
                   "truncate_prompt_tokens": 2}).json()["choices"][0]
    kept = echoed["prompt_token_ids"]
    assert len(kept) == 2
    text = post(server, "/detokenize", {"tokens": kept}).json()["prompt"]
    assert echoed["text"].startswith(text) and "one" not in text
    # -1: the last max_model_len tokens (a short prompt is whole); chat prompts too.
    whole = post(server, "/v1/completions",
                 {**body, "prompt": prompt, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(prompt)
    chat = post(server, "/v1/chat/completions",
                {"messages": USER, "max_tokens": 2, "truncate_prompt_tokens": 3, **NO_THINK})
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == 3
    max_len = requests.get(server.url("/v1/models"),
                           timeout=REQUEST_TIMEOUT_S).json()["data"][0]["max_model_len"]
    for bad in (0, -2, max_len + 1):
        error = assert_openai_error(
            post(server, "/v1/completions",
                 {"prompt": "hi", "max_tokens": 2, "truncate_prompt_tokens": bad}), 400)
        assert error["param"] == "truncate_prompt_tokens", error


def test_unknown_fields_are_ignored_with_a_log_line(server):
    r = post(server, "/v1/completions",
             {"prompt": "hi", "max_tokens": 1, "zz_not_a_field": 1, "zz_other": "x"})
    assert r.status_code == 200, r.text[:500]
    log = server.log_path.read_text(errors="replace")
    assert "present in the request but ignored: {zz_not_a_field, zz_other}" in log


def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_bad_words_are_never_generated(server):
    tokenize = lambda text: post(server, "/tokenize", {"prompt": text}).json()["tokens"]  # noqa
    # Sampling among a word's two tokens (allowed_token_ids): the pair appears without the
    # ban; with it (vLLM's rule: a word's last token is banned after the rest of it) never.
    candidates = ["the end", "Paris", "hello world", "good day", "hello", "time", "the", "and",
                  "of", "to", "is", "a"]
    word = next(w for w in candidates if len(tokenize(w)) == 2)
    pair = tokenize(word)
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "seed": 11,
            "temperature": 1.0, "allowed_token_ids": pair, "return_token_ids": True}
    free = post(server, "/v1/completions", body).json()["choices"][0]["token_ids"]
    assert contains(free, pair), free
    r = post(server, "/v1/completions", {**body, "bad_words": [word]})
    assert r.status_code == 200, r.text[:500]
    ids = r.json()["choices"][0]["token_ids"]
    assert not contains(ids, pair) and len(ids) == 24, ids
    # A one-token word is banned everywhere, as it starts a text and after a space.
    single = next(w for w in candidates
                  if len(tokenize(w)) == 1 and len(tokenize(" " + w)) == 1 and
                  tokenize(w) != tokenize(" " + w) and tokenize(w)[0] not in pair[1:])
    one, spaced = tokenize(single), tokenize(" " + single)
    body["allowed_token_ids"] = one + spaced + pair[1:]
    ids = post(server, "/v1/completions",
               {**body, "bad_words": [" " + single]}).json()["choices"][0]["token_ids"]
    assert set(ids) == set(pair[1:]), ids
    for bad in ([""], ["  "], "word", [3]):
        error = assert_openai_error(
            post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "bad_words": bad}),
            400)
        assert error["param"].startswith("bad_words"), error
