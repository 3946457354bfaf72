"""A second server started with --api-key: /v1 routes need `Authorization: Bearer KEY`."""

import openai
import pytest
import requests

from conftest import start_server

pytestmark = [pytest.mark.server, pytest.mark.api_key]

KEY = "secret"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("keyed"), ["--api-key", KEY], api_key=KEY)
    yield srv
    srv.stop()


def test_models_requires_key(keyed_server):
    url = keyed_server.url("/v1/models")
    assert requests.get(url, timeout=10).status_code == 401
    wrong = requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10)
    assert wrong.status_code == 401
    ok = requests.get(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert ok.status_code == 200
    assert ok.json()["data"][0]["id"] == keyed_server.model


def test_unauthorized_error_json(keyed_server):
    r = requests.post(keyed_server.url("/v1/completions"),
                      json={"model": keyed_server.model, "prompt": "hi", "max_tokens": 1},
                      timeout=10)
    assert r.status_code == 401
    assert "error" in r.json()


def test_sdk_with_and_without_key(keyed_server):
    good = keyed_server.client(api_key=KEY)
    r = good.chat.completions.create(model=keyed_server.model,
                                     messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].message.role == "assistant"
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="nope").models.list()


def test_tokenize_and_detokenize_are_open(keyed_server):
    # vLLM's key guards /v1/* only.
    r = requests.post(keyed_server.url("/tokenize"), json={"prompt": "hello"}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    tokens = r.json()["tokens"]
    r = requests.post(keyed_server.url("/detokenize"), json={"tokens": tokens}, timeout=10)
    assert r.status_code == 200 and r.json()["prompt"] == "hello"
    for route in ("/health", "/metrics"):
        assert requests.get(keyed_server.url(route), timeout=10).status_code == 200
    # A CORS preflight carries no key and is answered; the request itself needs it.
    r = requests.options(keyed_server.url("/v1/completions"),
                         headers={"Origin": "https://app.example",
                                  "Access-Control-Request-Method": "POST"}, timeout=10)
    assert r.status_code == 200
    assert requests.post(keyed_server.url("/v1/chat/completions"), json={},
                         timeout=10).status_code == 401
