"""Streaming chat and text completions: the SDK's view and the raw SSE framing."""

import json

import pytest
import requests

from conftest import CHAT, NO_THINK, REQUEST_TIMEOUT_S

pytestmark = [pytest.mark.server, pytest.mark.streaming]


def read_sse(response, max_events=2000):
    """The `data:` payloads of an SSE response, checking the framing of every event."""
    assert response.status_code == 200, response.text[:500]
    assert response.headers.get("content-type", "").startswith("text/event-stream")
    raw = b""
    for chunk in response.iter_content(chunk_size=None):
        raw += chunk
    text = raw.decode()
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    assert len(events) <= max_events
    payloads = []
    for event in events:
        assert event.startswith("data: "), f"event without 'data: ': {event[:120]!r}"
        assert "\n" not in event, f"multi-line event: {event[:120]!r}"
        payloads.append(event[len("data: "):])
    assert payloads[-1] == "[DONE]", f"last event is {payloads[-1][:120]!r}"
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def test_chat_stream_sdk(server, client):
    stream = client.chat.completions.create(
        model=server.model, messages=CHAT, max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, **NO_THINK})
    chunks = list(stream)
    assert len(chunks) >= 3
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    first = chunks[0].choices[0].delta
    assert first.role == "assistant"
    assert first.content == ""
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    u = usage_chunk.usage
    assert u.completion_tokens == 8
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    finals = [c for c in chunks[:-1] if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0] is chunks[-2]
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_matches_non_streaming(server, client):
    kwargs = dict(model=server.model, messages=CHAT, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True, **NO_THINK})
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == full


def test_chat_stream_raw_sse(server):
    body = {"model": server.model, "messages": CHAT, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, **NO_THINK}
    with requests.post(server.url("/v1/chat/completions"), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        chunks = read_sse(r)
    assert len({c["id"] for c in chunks}) == 1
    first = chunks[0]["choices"][0]["delta"]
    assert first.get("role") == "assistant" and first.get("content") == "", first
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    for c in chunks[1:-2]:
        assert c["choices"][0].get("finish_reason") is None
        assert "role" not in c["choices"][0]["delta"] or c["choices"][0]["delta"]["role"] is None


def test_completion_stream_raw_sse(server):
    body = {"model": server.model, "prompt": "Hello there", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    with requests.post(server.url("/v1/completions"), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        chunks = read_sse(r)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("cmpl-")
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    finals = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"


def test_chat_stream_without_usage_has_no_usage_chunk(server):
    body = {"model": server.model, "messages": CHAT, "max_tokens": 3, "stream": True,
            "ignore_eos": True}
    with requests.post(server.url("/v1/chat/completions"), json=body, stream=True,
                       timeout=REQUEST_TIMEOUT_S) as r:
        chunks = read_sse(r)
    assert all(c["choices"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
