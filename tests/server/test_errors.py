"""Invalid requests: HTTP status plus {"error": {"message", "type", "param", "code"}}."""

import pytest
import requests

from conftest import CHAT, assert_openai_error

pytestmark = [pytest.mark.server, pytest.mark.errors]


def post(server, route, body=None, data=None):
    kwargs = {"json": body} if data is None else {
        "data": data, "headers": {"Content-Type": "application/json"}}
    return requests.post(server.url(route), timeout=30, **kwargs)


def test_bad_json(server):
    for route in ("/v1/chat/completions", "/v1/completions"):
        assert_openai_error(post(server, route, data=b'{"model": "x", "messages": [}'), 400)


def test_max_tokens_wrong_type(server):
    r = post(server, "/v1/chat/completions",
             {"model": server.model, "messages": CHAT, "max_tokens": "ten"})
    assert_openai_error(r, 400)
    r = post(server, "/v1/completions", {"model": server.model, "prompt": "hi", "max_tokens": "ten"})
    assert_openai_error(r, 400)


def test_top_logprobs_without_logprobs(server):
    r = post(server, "/v1/chat/completions",
             {"model": server.model, "messages": CHAT, "max_tokens": 2, "top_logprobs": 3})
    assert_openai_error(r, 400)


def test_stream_options_without_stream(server):
    r = post(server, "/v1/chat/completions",
             {"model": server.model, "messages": CHAT, "max_tokens": 2,
              "stream_options": {"include_usage": True}})
    assert_openai_error(r, 400)


def test_prompt_longer_than_context(server):
    too_long = [300] * (server.max_model_len + 10)
    r = post(server, "/v1/completions", {"model": server.model, "prompt": too_long,
                                         "max_tokens": 2})
    error = assert_openai_error(r, 400)
    assert "maximum context length" in error["message"], error
    words = " hello" * (server.max_model_len + 10)
    r = post(server, "/v1/chat/completions",
             {"model": server.model, "messages": [{"role": "user", "content": words}],
              "max_tokens": 2})
    error = assert_openai_error(r, 400)
    assert "maximum context length" in error["message"], error


def test_unknown_model(server):
    r = post(server, "/v1/chat/completions",
             {"model": "no-such-model", "messages": CHAT, "max_tokens": 2})
    assert_openai_error(r, 404)
    r = post(server, "/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 2})
    assert_openai_error(r, 404)


def test_unknown_route(server):
    r = requests.get(server.url("/v1/no_such_route"), timeout=10)
    assert_openai_error(r, 404)
    r = requests.post(server.url("/no/such/route"), json={}, timeout=10)
    assert r.status_code == 404


def test_server_still_healthy_after_errors(server, client):
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
    r = client.completions.create(model=server.model, prompt="ok", max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_regex_guided_decoding_is_refused_not_ignored(server):
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, "guided_regex": "[a-z]+"}
    r = requests.post(server.url("/v1/chat/completions"), json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and err["param"] == "guided_regex"


def test_image_part_is_refused_for_text_only_serving(server):
    # The published Kimi K3 carries a vision tower; hyserve serves its text model only.
    for part in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                 {"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}}):
        r = post(server, "/v1/chat/completions",
                 {"model": server.model, "max_tokens": 2,
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"},
                                                            part]}]})
        error = assert_openai_error(r, 400)
        assert "text model only" in error["message"], error
        assert error["param"] == "messages[0].content[1].type", error
