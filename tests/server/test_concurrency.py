"""Many streams at once; a client that disconnects mid-stream."""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import CHAT, REQUEST_TIMEOUT_S, metric_sum, wait_idle

pytestmark = [pytest.mark.server, pytest.mark.concurrency]

NUM_CONCURRENT = 200


def stream_one(server, i):
    body = {"model": server.model, "messages": [{"role": "user", "content": f"Count to {i}."}],
            "max_tokens": 8, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    finish, usage, done = None, None, False
    with requests.post(server.url("/v1/chat/completions"), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200, r.text[:300]
        for line in r.iter_lines():
            if not line:
                continue
            payload = line.decode()[len("data: "):]
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                finish = chunk["choices"][0]["finish_reason"]
            if chunk.get("usage"):
                usage = chunk["usage"]
    return finish, usage, done


def test_two_hundred_concurrent_streams(server):
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=NUM_CONCURRENT) as pool:
        results = list(pool.map(lambda i: stream_one(server, i), range(NUM_CONCURRENT)))
    elapsed = time.monotonic() - start
    for i, (finish, usage, done) in enumerate(results):
        assert done, f"request {i}: no [DONE]"
        assert finish == "length", f"request {i}: finish_reason {finish}"
        assert usage and usage["completion_tokens"] == 8, f"request {i}: usage {usage}"
    assert elapsed < 90, f"{NUM_CONCURRENT} streams took {elapsed:.1f} s"
    wait_idle(server)


def test_client_disconnect_mid_stream(server, client):
    wait_idle(server)
    # Long enough that it would still be running for a while if the disconnect were missed.
    max_tokens = min(4000, server.max_model_len - 64)
    body = {"model": server.model, "prompt": "Tell me everything.", "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}
    r = requests.post(server.url("/v1/completions"), json=body, stream=True,
                      timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200
    events = 0
    for line in r.iter_lines():
        if line:
            events += 1
        if events >= 3:
            break
    assert events >= 3
    # Close the socket itself, not just the response object (urllib3 may pool it).
    sock = getattr(getattr(r.raw, "_connection", None), "sock", None)
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)
    r.close()
    # Uncancelled, the request would run for seconds more (about 5 s on 2 cores).
    waited = wait_idle(server, timeout_s=3)
    assert waited < 3
    # The server still answers.
    after = client.completions.create(model=server.model, prompt="Still there?", max_tokens=3,
                                      extra_body={"ignore_eos": True})
    assert after.usage.completion_tokens == 3
    assert metric_sum(server, "vllm:num_requests_running") == 0


def test_many_disconnects_then_request(server, client):
    for _ in range(5):
        body = {"model": server.model, "messages": CHAT, "max_tokens": 1000, "stream": True,
                "ignore_eos": True}
        with requests.post(server.url("/v1/chat/completions"), json=body, stream=True,
                           timeout=REQUEST_TIMEOUT_S) as r:
            assert r.status_code == 200
            next(r.iter_lines())
    wait_idle(server, timeout_s=15)
    r = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=2)
    assert r.choices[0].message.role == "assistant"
