"""POST /tokenize and /detokenize with the bundled tokenizer.

Expected ids come from Python tiktoken on models/tiny-kimi-k3/tiktoken.model (Kimi split
regex, specials at 768 + offset), as tools/make_bundled_tokenizer.py builds it.
"""

import pytest
import requests

from conftest import assert_openai_error

pytestmark = pytest.mark.server

CASES = [
    ("Hello, world! The model server streams tokens.",
     [346, 44, 381, 33, 32, 299, 542, 437, 556, 115, 473, 115, 46]),
    ("你好，世界！今天天气怎么样？",
     [575, 586, 760, 290, 150, 231, 149, 140, 674, 637, 516, 516, 230, 176, 148, 736, 582, 744,
      309, 159]),
    ("def f(x):\n    return x * 2\n", [603, 273, 598, 605, 347, 606, 504, 602, 32, 50, 10]),
    ("<|im_user|>user<|im_middle|>Hi<|im_end|>", [771, 117, 374, 785, 72, 105, 770]),
]


@pytest.mark.parametrize("text,ids", CASES, ids=["english", "chinese", "code", "specials"])
def test_tokenize_matches_tiktoken(server, text, ids):
    r = requests.post(server.url("/tokenize"), json={"model": server.model, "prompt": text,
                                                     "add_special_tokens": False}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert body["tokens"] == ids
    assert body["count"] == len(ids)
    d = requests.post(server.url("/detokenize"), json={"model": server.model, "tokens": ids},
                      timeout=10)
    assert d.status_code == 200, d.text[:300]
    assert d.json()["prompt"] == text


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


# As in vLLM, chat tokenization takes `tools`: the template declares them first, and the
# count is what a chat request with those tools reports as usage.prompt_tokens.
def test_tokenize_messages_with_tools(server):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    counts = {}
    for name, tools in (("without", {}), ("with", {"tools": [TOOL]})):
        r = requests.post(server.url("/tokenize"),
                          json={"model": server.model, "messages": messages, **tools}, timeout=10)
        assert r.status_code == 200, r.text[:300]
        counts[name] = r.json()["count"]
        text = requests.post(server.url("/detokenize"),
                             json={"model": server.model, "tokens": r.json()["tokens"]},
                             timeout=10).json()["prompt"]
        assert text.startswith("<|im_system|>tool_declare<|im_middle|>") == (name == "with")
    # tool_choice "none": the shared server has no --enable-auto-tool-choice, so "auto" (the
    # default with tools) is refused; the tools are still declared in the prompt.
    chat = requests.post(server.url("/v1/chat/completions"),
                         json={"model": server.model, "messages": messages, "tools": [TOOL],
                               "tool_choice": "none", "max_tokens": 1}, timeout=60)
    assert chat.status_code == 200, chat.text[:300]
    assert chat.json()["usage"]["prompt_tokens"] == counts["with"] > counts["without"]
    bad = requests.post(server.url("/tokenize"),
                        json={"model": server.model, "messages": messages, "tools": "x"},
                        timeout=10)
    assert_openai_error(bad, 400)
