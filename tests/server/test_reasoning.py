"""A server started with --reasoning-parser kimi_k3: output after the template's <think> is
`reasoning` until </think>; chat_template_kwargs.thinking=false makes it `content`.

logit_bias +100 on one ordinary token makes the output known (that token, repeated).
"""

import json

import pytest
import requests

from conftest import REQUEST_TIMEOUT_S, start_server

pytestmark = pytest.mark.server

TOKEN = 500
MAX_TOKENS = 6
BODY = {"messages": [{"role": "user", "content": "Think first."}], "max_tokens": MAX_TOKENS,
        "ignore_eos": True, "logit_bias": {str(TOKEN): 100}}


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("reasoning"), ["--reasoning-parser", "kimi_k3"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected_text(reasoning_server):
    r = requests.post(reasoning_server.url("/detokenize"),
                      json={"model": reasoning_server.model, "tokens": [TOKEN] * MAX_TOKENS},
                      timeout=10)
    assert r.status_code == 200, r.text[:300]
    return r.json()["prompt"]


def chat(srv, **extra):
    r = requests.post(srv.url("/v1/chat/completions"), json={"model": srv.model, **BODY, **extra},
                      timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text[:300]
    return r.json()["choices"][0]["message"]


def test_thinking_output_is_reasoning(reasoning_server, expected_text):
    message = chat(reasoning_server)
    assert message.get("reasoning") == expected_text
    assert message.get("content") in (None, "")


def test_thinking_off_output_is_content(reasoning_server, expected_text):
    message = chat(reasoning_server, chat_template_kwargs={"thinking": False})
    assert message.get("content") == expected_text
    assert not message.get("reasoning")


def test_streamed_reasoning_deltas(reasoning_server, expected_text):
    body = {"model": reasoning_server.model, **BODY, "stream": True}
    reasoning, content = "", ""
    with requests.post(reasoning_server.url("/v1/chat/completions"), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            payload = line.decode()[len("data: "):] if line else ""
            if not payload or payload == "[DONE]":
                continue
            for choice in json.loads(payload)["choices"]:
                reasoning += choice["delta"].get("reasoning") or ""
                content += choice["delta"].get("content") or ""
    assert reasoning == expected_text
    assert content == ""
