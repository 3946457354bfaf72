"""10,000 connections at once on one server (issue 25, item 8): idle keep-alives, silent
connections and 1,000 live streams, held together while a fresh probe is still answered
quickly; and 2,000 half-sent requests that neither lock a probe out nor stay open past the
header timeout; --max-connections and VLLM_HTTP_TIMEOUT_KEEP_ALIVE. The mass clients are raw asyncio streams on loopback (one thread, no
client library); the process's open-file limit is raised to hold them.
"""

import asyncio
import json
import resource
import subprocess
import time

import pytest
import requests

from conftest import MODEL_DIR, binary_path, free_port, server_environment, start_server

pytestmark = [pytest.mark.server, pytest.mark.concurrency]

NUM_IDLE = 8000  # keep-alive connections that answered one request, then idle
NUM_SILENT = 1000  # connected, nothing sent yet
NUM_STREAMS = 1000  # streaming completions
NUM_HALF_SENT = 2000
MAX_TOKENS = 8
PROMPTS = [f"Count to {i}:" for i in range(10)]
CONNECT_PARALLELISM = 200
HEADER_TIMEOUT_S = 10.0  # the server's (HttpServerOptions::header_timeout_ms)
PROBE_LIMIT_S = 3.0


def raise_open_files(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"open-file hard limit {hard} < {needed} needed for this test")
    if soft == resource.RLIM_INFINITY or soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@pytest.fixture(scope="module")
def big_server(tmp_path_factory):
    raise_open_files(NUM_IDLE + NUM_SILENT + NUM_STREAMS + 500)
    # Idle connections must outlive the setup of the others (vLLM's default is 5 s).
    srv = start_server(tmp_path_factory.mktemp("many"),
                       env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"})
    yield srv
    srv.stop()


def port_of(server):
    return int(server.base_url.rsplit(":", 1)[1])


async def read_response(reader):
    """(status, body bytes) of one response; a chunked body is de-chunked."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += data[:-2]
        return status, bytes(body)
    return status, await reader.readexactly(int(headers.get("content-length", "0")))


def get(path):
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


def post_json(path, body):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def open_many(port, count, first_bytes=None):
    """`count` connections (each sent `first_bytes` when given), opened CONNECT_PARALLELISM
    at a time so the listen backlog never overflows."""
    gate = asyncio.Semaphore(CONNECT_PARALLELISM)

    async def one():
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if first_bytes is not None:
                writer.write(first_bytes)
                await writer.drain()
            return reader, writer

    return await asyncio.gather(*(one() for _ in range(count)))


def stream_body(server, i):
    return {"model": server.model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def parse_stream(body):
    """The text, the finish reasons and the usage of an SSE completion stream; raises on any
    event that is not JSON, or on a missing [DONE]."""
    events = [e for e in body.decode().split("\n\n") if e]
    assert events and events[-1] == "data: [DONE]", f"no [DONE] at the end: {events[-3:]}"
    text, finishes, usage = "", [], None
    for event in events[:-1]:
        assert event.startswith("data: "), event
        chunk = json.loads(event[len("data: "):])
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            text += choice["text"]
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
        if chunk.get("usage"):
            usage = chunk["usage"]
    return text, finishes, usage


def probe(server):
    """Seconds a GET /v1/models on a fresh connection takes (blocking, from a thread)."""
    start = time.monotonic()
    r = requests.get(server.url("/v1/models"), timeout=30,
                     headers={"Connection": "close"})
    assert r.status_code == 200, r.text[:300]
    return time.monotonic() - start


async def close_all(connections):
    for _, writer in connections:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in connections), return_exceptions=True)


def test_ten_thousand_connections_with_a_thousand_streams(big_server):
    server = big_server
    port = port_of(server)
    # What each prompt's greedy 8 tokens are, one request at a time.
    expected = {}
    for prompt in PROMPTS:
        r = requests.post(server.url("/v1/completions"), timeout=30, json={
            "model": server.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text[:300]
        expected[prompt] = r.json()["choices"][0]["text"]

    async def scenario():
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        idle = await open_many(port, NUM_IDLE, get("/health"))
        statuses = await asyncio.gather(*(read_response(r) for r, _ in idle))
        assert all(s == 200 for s, _ in statuses), "an idle connection's first request failed"
        silent = await open_many(port, NUM_SILENT)
        streams = await open_many(port, NUM_STREAMS)
        opened_s = time.monotonic() - start
        # 10,000 connections open; every stream's request goes out now.
        for i, (_, writer) in enumerate(streams):
            writer.write(post_json("/v1/completions", stream_body(server, i)))
        probe_task = loop.run_in_executor(None, probe, server)
        results = await asyncio.wait_for(
            asyncio.gather(*(read_response(r) for r, _ in streams)), timeout=150)
        probe_s = await probe_task
        streams_s = time.monotonic() - start - opened_s

        # None lost: every idle and silent connection still answers.
        for _, writer in idle + silent:
            writer.write(get("/health"))
        after = await asyncio.wait_for(
            asyncio.gather(*(read_response(r) for r, _ in idle + silent)), timeout=60)
        total_s = time.monotonic() - start
        await close_all(idle + silent + streams)
        return results, after, probe_s, opened_s, streams_s, total_s

    results, after, probe_s, opened_s, streams_s, total_s = asyncio.run(scenario())
    for i, (status, body) in enumerate(results):
        assert status == 200, f"stream {i}: HTTP {status}: {body[:300]}"
        text, finishes, usage = parse_stream(body)
        assert finishes == ["length"], f"stream {i}: finish reasons {finishes}"
        assert usage and usage["completion_tokens"] == MAX_TOKENS, f"stream {i}: usage {usage}"
        prompt = PROMPTS[i % len(PROMPTS)]
        assert text == expected[prompt], f"stream {i}: {text!r} != {expected[prompt]!r}"
    assert [s for s, _ in after] == [200] * (NUM_IDLE + NUM_SILENT), "a held connection was lost"
    assert probe_s < PROBE_LIMIT_S, f"probe took {probe_s:.2f} s with 10,000 connections open"
    print(f"\n{NUM_IDLE + NUM_SILENT + NUM_STREAMS} connections opened in {opened_s:.1f} s; "
          f"{NUM_STREAMS} streams done in {streams_s:.1f} s; probe {probe_s * 1000:.0f} ms; "
          f"all {total_s:.1f} s")


def test_half_sent_requests_neither_lock_out_nor_linger(big_server):
    server = big_server
    port = port_of(server)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"

    async def scenario():
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        half = await open_many(port, NUM_HALF_SENT, head)
        sent_s = time.monotonic() - start
        probe_s = await loop.run_in_executor(None, probe, server)

        async def outcome(reader):
            data = await reader.read()  # to EOF: the response, then the close
            return data, time.monotonic() - start

        outcomes = await asyncio.wait_for(
            asyncio.gather(*(outcome(r) for r, _ in half)), timeout=HEADER_TIMEOUT_S + 30)
        await close_all(half)
        return sent_s, probe_s, outcomes

    sent_s, probe_s, outcomes = asyncio.run(scenario())
    assert probe_s < PROBE_LIMIT_S, f"probe took {probe_s:.2f} s behind {NUM_HALF_SENT} half-sent"
    for i, (data, closed_s) in enumerate(outcomes):
        assert data.startswith(b"HTTP/1.1 408 "), f"connection {i}: {data[:200]!r}"
        # Closed once the header timeout has passed, not long after (nor before).
        assert HEADER_TIMEOUT_S - 1 <= closed_s <= sent_s + HEADER_TIMEOUT_S + 5, (
            f"connection {i} closed after {closed_s:.1f} s")
    print(f"\n{NUM_HALF_SENT} half-sent requests: probe {probe_s * 1000:.0f} ms, all closed with "
          f"408 by {max(s for _, s in outcomes):.1f} s")


async def open_served(port, request, within_s=5.0):
    """One connection that the server served (not 503) with `request`'s response, retried for
    up to `within_s`: a slot freed by a close the server has not read yet (start_server's
    /health probe, a refused connection) is free only once the server has seen that close."""
    deadline = time.monotonic() + within_s
    while True:
        [(reader, writer)] = await open_many(port, 1, request)
        status, body = await read_response(reader)
        if status != 503 or time.monotonic() > deadline:
            return (reader, writer), (status, body)
        await close_all([(reader, writer)])
        await asyncio.sleep(0.05)


def test_max_connections_caps_with_503_and_keep_alive_env(tmp_path):
    srv = start_server(tmp_path, ["--max-connections", "4"],
                       env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "1"})
    port = port_of(srv)

    async def scenario():
        held, first = [], []
        for _ in range(4):
            connection, response = await open_served(port, get("/health"))
            held.append(connection)
            first.append(response)
        # Four are open and were served: a fifth is over the cap, at once.
        extra = await open_many(port, 1, get("/health"))
        refused = await read_response(extra[0][0])
        await close_all(extra)
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE=1: the idle ones are closed about a second later.
        start = time.monotonic()
        eofs = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in held)), timeout=10)
        idle_closed_s = time.monotonic() - start
        await close_all(held)
        again, served = await open_served(port, get("/health"))
        await close_all([again])
        return first, refused, eofs, idle_closed_s, served

    try:
        first, refused, eofs, idle_closed_s, served = asyncio.run(scenario())
    finally:
        srv.stop()
    assert [s for s, _ in first] == [200] * 4
    status, body = refused
    assert status == 503, body
    assert json.loads(body)["error"]["code"] == 503
    assert eofs == [b""] * 4 and idle_closed_s < 3, f"idle connections closed after {idle_closed_s}"
    assert served[0] == 200, "a connection freed by the cap was not served again"


def test_bad_keep_alive_env_and_max_connections_are_refused():
    for args, env, message in (
            (["--max-connections", "0"], {}, "--max-connections must be at least 1"),
            ([], {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "soon"}, "VLLM_HTTP_TIMEOUT_KEEP_ALIVE")):
        r = subprocess.run([str(binary_path()), "serve", str(MODEL_DIR), "--port",
                            str(free_port()), *args], capture_output=True, text=True, timeout=60,
                           env={**server_environment(), **env})
        assert r.returncode != 0, f"{args} {env} accepted"
        assert message in r.stdout + r.stderr, r.stdout + r.stderr
