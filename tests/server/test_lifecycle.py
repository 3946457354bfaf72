"""Shutdown: SIGTERM with a stream in flight ends the process within a bounded time."""

import subprocess
import threading
import time

import pytest
import requests

from conftest import start_server

pytestmark = pytest.mark.server

EXIT_TIMEOUT_S = 15


def test_sigterm_with_stream_in_flight(tmp_path):
    srv = start_server(tmp_path)
    try:
        body = {"model": srv.model, "prompt": "Go on.", "stream": True, "ignore_eos": True,
                "max_tokens": 1000}
        started = threading.Event()

        def stream():
            try:
                with requests.post(srv.url("/v1/completions"), json=body, stream=True,
                                   timeout=30) as r:
                    for _ in r.iter_lines():
                        started.set()
            except requests.RequestException:
                pass
            started.set()

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(timeout=30), "the stream produced nothing"
        start = time.monotonic()
        srv.proc.terminate()
        try:
            srv.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hyserve did not exit within {EXIT_TIMEOUT_S} s of SIGTERM with a "
                        "stream in flight")
        assert time.monotonic() - start < EXIT_TIMEOUT_S
        reader.join(timeout=EXIT_TIMEOUT_S)
        assert not reader.is_alive(), "the client stream did not end after the server exited"
    finally:
        srv.stop()
