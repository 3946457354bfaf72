"""Requests that ask for too much, and clients that leave: refused or aborted at once,
without holding up anyone else (issue 25, items 1 and 2)."""

import time

import pytest
import requests

from conftest import assert_openai_error, metric_sum, wait_idle

pytestmark = [pytest.mark.server]


def _aborted(server):
    from conftest import metric_samples
    text = requests.get(server.url("/metrics"), timeout=10).text
    return sum(v for labels, v in metric_samples(text, "vllm:request_success_total")
               if 'finished_reason="abort"' in labels)


def test_more_sequences_than_the_cap_is_a_400(server):
    start = time.monotonic()
    r = requests.post(server.url("/v1/completions"), timeout=60, json={
        "model": server.model, "prompt": [[5]] * 200000, "max_tokens": 1})
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == "prompt"
    assert "--max-sequences-per-request" in r.json()["error"]["message"]
    r = requests.post(server.url("/v1/completions"), timeout=60, json={
        "model": server.model, "prompt": [[5]] * 513, "n": 2, "max_tokens": 1})
    assert_openai_error(r, 400)
    r = requests.post(server.url("/v1/chat/completions"), timeout=60, json={
        "model": server.model, "messages": [{"role": "user", "content": "hi"}], "n": 1025,
        "max_tokens": 1})
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == "n"
    assert time.monotonic() - start < 30
    # At the cap it runs.
    r = requests.post(server.url("/v1/completions"), timeout=120, json={
        "model": server.model, "prompt": [[5]] * 8, "n": 2, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 16


def test_a_client_leaving_a_busy_non_streaming_request_aborts_it(server):
    """Outputs keep coming, yet the disconnect is seen within a poll: the engine stops."""
    wait_idle(server)
    before = _aborted(server)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(server.url("/v1/completions"), timeout=1.0, json={
            "model": server.model, "prompt": "go on and on", "max_tokens": 3000,
            "ignore_eos": True})
    left = time.monotonic()
    wait_idle(server, timeout_s=10)
    assert time.monotonic() - left < 5
    assert _aborted(server) - before == 1


def test_a_large_batch_cancelled_does_not_stall_others(server):
    """A 1000-prompt request whose client leaves: its 1000 aborts do not hold up a probe."""
    wait_idle(server)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(server.url("/v1/completions"), timeout=1.0, json={
            "model": server.model, "prompt": [[5, 6, 7]] * 1000, "max_tokens": 200,
            "ignore_eos": True})
    start = time.monotonic()
    r = requests.post(server.url("/v1/completions"), timeout=60, json={
        "model": server.model, "prompt": "probe", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert time.monotonic() - start < 10
    wait_idle(server, timeout_s=20)
    assert metric_sum(server, "vllm:num_requests_waiting") == 0
