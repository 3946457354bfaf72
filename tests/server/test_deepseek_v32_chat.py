"""DeepSeek-V3.2 chat (issue 25, item 14): the checkpoint ships no Jinja template, so hyserve
uses its built-in DeepSeek-V3.2 encoding; served with vLLM's `--tool-call-parser deepseek_v32
--reasoning-parser deepseek_v3`.

The model is tests/fixtures/deepseek_v32_tiny (vocabulary 1,024) with the DeepSeek tokenizer
fixture cut to fit it: the first 1,016 ids (its merges that stay inside them) and <think> /
</think> moved to 1016 / 1017. logit_bias +100 on one ordinary token makes the output known.
"""

import json
import os

import pytest
import requests

from conftest import REPO_ROOT, REQUEST_TIMEOUT_S, start_server

pytestmark = pytest.mark.server

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "deepseek_v32_tiny"
TOKENIZER = REPO_ROOT / "tests" / "fixtures" / "tokenizer" / "deepseek" / "tokenizer.json"
NUM_KEPT_IDS = 1016
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
TOKEN = 500
MAX_TOKENS = 5
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def write_tokenizer(path):
    t = json.loads(TOKENIZER.read_text())
    vocab = {s: i for s, i in t["model"]["vocab"].items() if i < NUM_KEPT_IDS}
    t["model"]["vocab"] = vocab
    t["model"]["merges"] = [m for m in t["model"]["merges"]
                            if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    next_id = NUM_KEPT_IDS
    for added in t["added_tokens"]:
        if added["id"] >= NUM_KEPT_IDS:
            added["id"] = next_id
            next_id += 1
    path.write_text(json.dumps(t, ensure_ascii=False))


@pytest.fixture(scope="module")
def dsv32(tmp_path_factory):
    model = tmp_path_factory.mktemp("dsv32-model")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(FIXTURE / name, model / name)
    write_tokenizer(model / "tokenizer.json")
    # As the checkpoint's: LlamaTokenizerFast, whose encode adds BOS (add_bos_token).
    (model / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "LlamaTokenizerFast",
                    "add_bos_token": True, "add_eos_token": False}, ensure_ascii=False))
    # The tools section is longer than the fixture's 128 positions.
    srv = start_server(tmp_path_factory.mktemp("dsv32"),
                       ["--max-model-len", "1024", "--enable-auto-tool-choice",
                        "--tool-call-parser", "deepseek_v32", "--reasoning-parser", "deepseek_v3"],
                       model_dir=model, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    yield srv
    srv.stop()


def tokenize(srv, **body):
    r = requests.post(srv.url("/tokenize"), json={"model": srv.model, **body}, timeout=10)
    assert r.status_code == 200, r.text[:500]
    return r.json()["tokens"]


def detokenize(srv, tokens):
    r = requests.post(srv.url("/detokenize"), json={"model": srv.model, "tokens": tokens},
                      timeout=10)
    assert r.status_code == 200, r.text[:500]
    return r.json()["prompt"]


def test_tokenize_messages_gives_the_encoding(dsv32):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Weather?"}]
    turns = (BOS + "Be brief." + USER + "Hi" + ASSISTANT + "</think>Hello." + EOS + USER +
             "Weather?" + ASSISTANT)
    assert tokenize(dsv32, messages=messages) == tokenize(dsv32, prompt=turns + "</think>",
                                                    add_special_tokens=False)
    assert (tokenize(dsv32, messages=messages, chat_template_kwargs={"thinking": True})
            == tokenize(dsv32, prompt=turns + "<think>", add_special_tokens=False))
    # BOS and the turn markers are single special tokens.
    ids = tokenize(dsv32, messages=messages[1:2])
    assert ids[0] == 0 and ids[1] == 2 and ids[-2:] == [3, NUM_KEPT_IDS + 1]


def test_tokenize_tools_and_tool_results(dsv32):
    messages = [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    text = detokenize(dsv32, tokenize(dsv32, messages=messages, tools=TOOLS))
    schema = json.dumps(TOOLS[0]["function"], ensure_ascii=False)
    assert text.startswith(BOS + "\n\n## Tools\nYou have access to a set of tools")
    assert ("Here are the functions available in JSONSchema format:\n<functions>\n" + schema +
            "\n</functions>\n" + USER + "Paris?" + ASSISTANT + "</think>") in text
    assert text.endswith(
        "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>" + EOS +
        "\n\n<function_results>\n<result>Sunny</result>\n</function_results>\n\n</think>")


def test_chat_completions_with_the_openai_sdk(dsv32):
    client = dsv32.client()
    out = client.chat.completions.create(
        model=dsv32.model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens == len(tokenize(dsv32, messages=[
        {"role": "user", "content": "Hello"}]))
    with_tools = client.chat.completions.create(
        model=dsv32.model, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS, max_tokens=4)
    assert with_tools.choices[0].finish_reason in ("stop", "length", "tool_calls")
    chunks = list(client.chat.completions.create(
        model=dsv32.model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4,
        stream=True, extra_body={"chat_template_kwargs": {"thinking": True}}))
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def forced_chat(srv, **extra):
    body = {"model": srv.model, "messages": [{"role": "user", "content": "Think first."}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "logit_bias": {str(TOKEN): 100},
            **extra}
    r = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text[:500]
    return r.json()["choices"][0]["message"]


def test_reasoning_follows_deepseek_thinking_mode(dsv32):
    expected = detokenize(dsv32, [TOKEN] * MAX_TOKENS)
    # Thinking is off by default for DeepSeek-V3.2 (vLLM): everything is content.
    off = forced_chat(dsv32)
    assert off["content"] == expected
    assert not off.get("reasoning")
    # Thinking on: no </think> in the output, so all of it is reasoning.
    on = forced_chat(dsv32, chat_template_kwargs={"thinking": True})
    assert not on.get("content")
    assert on["reasoning"] == expected


def test_a_sampled_id_without_a_token_reads_as_nothing(dsv32):
    """The checkpoint's 1,024 embedding rows outnumber the tokenizer's tokens (as DeepSeek-V3's
    129,280 do): a sampled id without a token reads as nothing, in the message, the stream and
    the logprobs, as vLLM's detokenizer does; it does not fail the request."""
    rows = json.loads((FIXTURE / "config.json").read_text())["vocab_size"]
    num_added = len(json.loads(TOKENIZER.read_text())["added_tokens"])
    hole = rows - 1
    assert NUM_KEPT_IDS + num_added <= hole  # the ids write_tokenizer assigns end below it
    body = {"model": dsv32.model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 3, "ignore_eos": True, "logit_bias": {str(hole): 100},
            "logprobs": True, "top_logprobs": 2}
    r = requests.post(dsv32.url("/v1/chat/completions"), json=body, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text[:500]
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == ""
    assert [t["token"] for t in choice["logprobs"]["content"]] == [""] * 3
    assert choice["finish_reason"] == "length"
    r = requests.post(dsv32.url("/v1/chat/completions"), json={**body, "stream": True},
                      stream=True, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200
    events = [line[len(b"data: "):] for line in r.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), chunks
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    # /detokenize reads ids a client gives: one without a token is the client's error.
    r = requests.post(dsv32.url("/detokenize"), json={"model": dsv32.model, "tokens": [hole]},
                      timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 400, r.text[:500]


def test_completions_add_bos_as_vllm_does(dsv32):
    """vLLM's add_special_tokens: on for completions' text prompts and /tokenize's prompt (the
    tokenizer's BOS, as Hugging Face's encode adds it), off for chat (the encoding has its
    own BOS) and for token-id prompts."""
    bos = tokenize(dsv32, prompt=BOS, add_special_tokens=False)
    assert len(bos) == 1
    text = tokenize(dsv32, prompt="Hello world", add_special_tokens=False)
    assert tokenize(dsv32, prompt="Hello world") == bos + text
    body = {"model": dsv32.model, "max_tokens": 1, "return_token_ids": True}
    r = requests.post(dsv32.url("/v1/completions"), json={**body, "prompt": "Hello world"},
                      timeout=REQUEST_TIMEOUT_S).json()
    assert r["choices"][0]["prompt_token_ids"] == bos + text
    r = requests.post(dsv32.url("/v1/completions"),
                      json={**body, "prompt": "Hello world", "add_special_tokens": False},
                      timeout=REQUEST_TIMEOUT_S).json()
    assert r["choices"][0]["prompt_token_ids"] == text
    r = requests.post(dsv32.url("/v1/completions"), json={**body, "prompt": text},
                      timeout=REQUEST_TIMEOUT_S).json()
    assert r["choices"][0]["prompt_token_ids"] == text
    messages = [{"role": "user", "content": "Hello"}]
    chat = tokenize(dsv32, messages=messages)
    assert chat[:1] == bos and chat[1:2] != bos
    r = requests.post(dsv32.url("/v1/chat/completions"),
                      json={**body, "messages": messages}, timeout=REQUEST_TIMEOUT_S).json()
    assert r["usage"]["prompt_tokens"] == len(chat)
    r = requests.post(dsv32.url("/v1/chat/completions"),
                      json={**body, "messages": messages, "add_special_tokens": True},
                      timeout=REQUEST_TIMEOUT_S).json()
    assert r["usage"]["prompt_tokens"] == len(chat) + 1
