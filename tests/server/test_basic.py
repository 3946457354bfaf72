"""GET /health, /ping, /version, GET /v1/models, chat and text completions without streaming."""

import subprocess

import pytest
import requests

from conftest import CHAT, NO_THINK, binary_path

pytestmark = pytest.mark.server


def test_health(server):
    assert requests.get(server.url("/health"), timeout=10).status_code == 200


def test_ping_and_version_as_vllm_answers_them(server):
    # /ping: /health's answer, GET and POST (SageMaker's probe); /version: {"version": ...},
    # the same string as `hyserve --version` prints.
    assert requests.get(server.url("/ping"), timeout=10).status_code == 200
    assert requests.post(server.url("/ping"), timeout=10).status_code == 200
    r = requests.get(server.url("/version"), timeout=10)
    assert r.status_code == 200
    version = r.json()["version"]
    out = subprocess.run([str(binary_path()), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0
    assert out.stdout.strip() == version
    assert requests.put(server.url("/version"), timeout=10).status_code in (404, 405)


def test_models_shape(server):
    r = requests.get(server.url("/v1/models"), timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert len(body["data"]) >= 1
    card = body["data"][0]
    assert card["object"] == "model"
    assert isinstance(card["id"], str) and card["id"]
    assert isinstance(card["created"], int)
    assert isinstance(card["owned_by"], str)
    assert isinstance(card.get("max_model_len"), int) and card["max_model_len"] > 0


def test_models_via_sdk(server, client):
    ids = [m.id for m in client.models.list().data]
    assert server.model in ids


def test_chat_non_streaming(server, client):
    r = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=12,
                                       extra_body=NO_THINK)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == server.model
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in {"stop", "length"}
    u = r.usage
    assert u.prompt_tokens > 0
    assert 1 <= u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_chat_max_tokens_ignore_eos(server, client):
    for max_tokens in (1, 7):
        r = client.chat.completions.create(
            model=server.model, messages=CHAT, max_tokens=max_tokens,
            extra_body={"ignore_eos": True, **NO_THINK})
        assert r.choices[0].finish_reason == "length", f"max_tokens={max_tokens}"
        assert r.usage.completion_tokens == max_tokens


def test_chat_max_completion_tokens(server, client):
    r = client.chat.completions.create(model=server.model, messages=CHAT,
                                       max_completion_tokens=5,
                                       extra_body={"ignore_eos": True, **NO_THINK})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_chat_n2(server, client):
    r = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=6, n=2,
                                       temperature=1.0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        assert c.message.role == "assistant"
        assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_completion_string_prompt(server, client):
    r = client.completions.create(model=server.model, prompt="The capital of France is",
                                  max_tokens=8, echo=False, extra_body={"ignore_eos": True})
    assert r.id.startswith("cmpl-")
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    c = r.choices[0]
    assert isinstance(c.text, str)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_completion_echo_false_excludes_prompt(server, client):
    prompt = "Once upon a time"
    echoed = client.completions.create(model=server.model, prompt=prompt, max_tokens=4,
                                       temperature=0, echo=True,
                                       extra_body={"ignore_eos": True})
    plain = client.completions.create(model=server.model, prompt=prompt, max_tokens=4,
                                      temperature=0, echo=False,
                                      extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == prompt + plain.choices[0].text


def test_completion_token_id_prompt(server, client):
    ids = [300, 301, 302, 303, 304]
    r = client.completions.create(model=server.model, prompt=ids, max_tokens=5, echo=False,
                                  extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"


def test_completion_n2(server, client):
    r = client.completions.create(model=server.model, prompt="Hello", max_tokens=4, n=2,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 8


def test_completion_prompt_lists(server, client):
    r = client.completions.create(model=server.model, prompt=["Hello", "Goodbye"], max_tokens=3,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 6
    r = client.completions.create(model=server.model, prompt=[[300, 301], [302, 303, 304]],
                                  max_tokens=2, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.prompt_tokens == 5
    assert r.usage.completion_tokens == 4
