"""Generation control and weight updates while serving (issue 48 item 4), as vLLM's
development routes (VLLM_SERVER_DEV_MODE=1): /pause (abort, wait, keep) and /resume,
/reset_prefix_cache, /sleep (levels 1 and 2) with /wake_up (tags) and /is_sleeping, and the
weight-transfer protocol (/init_weight_transfer_engine, /start_weight_update,
/update_weights, /finish_weight_update) driven by `hyserve send-weights` over Gloo and by a
folder path. After an update the server's outputs equal those of a fresh server started on
the new weights, token for token and logprob for logprob.
"""

import json
import shutil
import struct
import subprocess
import threading
import time

import pytest
import requests

from conftest import (MODEL_DIR, assert_openai_error, binary_path, metric_sum, server_environment,
                      start_server)

PROMPT = "The capital of France is a city where"
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
FLAGS = ["--enable-sleep-mode", "--weight-transfer-config", '{"backend": "gloo"}',
         "--enable-prefix-caching"]


def complete(server, prompt=PROMPT, max_tokens=8, timeout=60):
    r = requests.post(server.url("/v1/completions"), timeout=timeout, json={
        "model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def perturbed_copy(dst):
    """The bundled model's folder with every bf16 value changed in one mantissa bit."""
    shutil.copytree(MODEL_DIR, dst)
    path = dst / "model.safetensors"
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "BF16":
            continue
        begin, end = t["data_offsets"]
        for i in range(8 + n + begin, 8 + n + end, 2):
            raw[i] ^= 0x08
    path.write_bytes(bytes(raw))
    return dst


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("rl_control"), FLAGS, env=DEV)
    yield srv
    srv.stop()


def post(server, route, **kwargs):
    return requests.post(server.url(route), timeout=120, **kwargs)


def test_routes_need_dev_mode(server):
    assert requests.post(server.url("/pause"), timeout=10).status_code == 404
    assert requests.post(server.url("/reset_prefix_cache"), timeout=10).status_code == 404
    assert requests.post(server.url("/update_weights"), timeout=10, json={}).status_code == 404


def test_pause_keep_then_resume_finishes_the_request(dev_server):
    before = complete(dev_server)
    assert post(dev_server, "/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    assert requests.get(dev_server.url("/is_paused"), timeout=10).json() == {"is_paused": True}
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("out", complete(dev_server)))
    t.start()
    time.sleep(1.0)
    assert "out" not in result, "a request ran while paused"
    assert post(dev_server, "/resume").json() == {"status": "resumed"}
    t.join(timeout=60)
    assert result["out"] == before
    assert requests.get(dev_server.url("/is_paused"), timeout=10).json() == {"is_paused": False}


def test_pause_abort_ends_a_running_stream(dev_server):
    r = requests.post(dev_server.url("/v1/completions"), stream=True, timeout=60, json={
        "model": dev_server.model, "prompt": PROMPT, "max_tokens": 2000, "temperature": 0,
        "ignore_eos": True, "stream": True})
    lines = r.iter_lines()
    next(lines)  # the stream is running
    assert post(dev_server, "/pause", params={"mode": "abort"}).status_code == 200
    reasons = [json.loads(line[6:])["choices"][0].get("finish_reason")
               for line in lines if line.startswith(b"data: {")]
    assert "abort" in reasons
    assert post(dev_server, "/resume").status_code == 200
    complete(dev_server)


def test_bad_control_requests(dev_server):
    assert_openai_error(post(dev_server, "/pause", params={"mode": "later"}), 400)
    assert_openai_error(post(dev_server, "/sleep", params={"level": "3"}), 400)
    assert_openai_error(post(dev_server, "/sleep", params={"mode": "keep"}), 400)
    assert_openai_error(post(dev_server, "/wake_up", params={"tags": "everything"}), 400)
    assert_openai_error(post(dev_server, "/update_weights", json={"update_info": {}}), 400)
    assert_openai_error(post(dev_server, "/init_weight_transfer_engine", json={
        "init_info": {"master_port": 1, "rank_offset": 0, "world_size": 2}}), 400)
    # An update before /start_weight_update.
    assert_openai_error(post(dev_server, "/update_weights", json={
        "update_info": {"weights_path": str(MODEL_DIR)}}), 400)


def test_reset_prefix_cache(dev_server):
    prompt = "Tell me about the mountains and the rivers of the north, " * 8
    complete(dev_server, prompt)
    hits = metric_sum(dev_server, "vllm:prefix_cache_hits_total")
    complete(dev_server, prompt)
    assert metric_sum(dev_server, "vllm:prefix_cache_hits_total") > hits
    assert post(dev_server, "/reset_prefix_cache").status_code == 200
    hits = metric_sum(dev_server, "vllm:prefix_cache_hits_total")
    complete(dev_server, prompt)
    assert metric_sum(dev_server, "vllm:prefix_cache_hits_total") == hits


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_and_wake_up(dev_server, level):
    before = complete(dev_server)
    assert post(dev_server, "/sleep", params={"level": str(level)}).status_code == 200
    assert requests.get(dev_server.url("/is_sleeping"), timeout=10).json() == {"is_sleeping": True}
    assert_openai_error(post(dev_server, "/resume"), 400)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("out", complete(dev_server)))
    t.start()
    time.sleep(0.5)
    assert "out" not in result, "a request ran while asleep"
    assert post(dev_server, "/wake_up", params={"tags": "weights"}).status_code == 200
    assert requests.get(dev_server.url("/is_sleeping"), timeout=10).json() == {"is_sleeping": True}
    assert post(dev_server, "/wake_up", params={"tags": "kv_cache"}).status_code == 200
    assert requests.get(dev_server.url("/is_sleeping"), timeout=10).json() == {"is_sleeping": False}
    t.join(timeout=60)
    assert result["out"] == before


def send_weights(server, folder, *extra):
    proc = subprocess.run([str(binary_path()), "send-weights", "--url", server.base_url,
                           "--folder", str(folder), "--timeout", "60", *extra],
                          capture_output=True, text=True, timeout=180, env=server_environment())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_weight_updates_equal_a_fresh_server(dev_server, tmp_path):
    new_dir = perturbed_copy(tmp_path / "perturbed")
    original = complete(dev_server)
    fresh = start_server(tmp_path, env=DEV, model_dir=new_dir)
    try:
        want = complete(fresh)
    finally:
        fresh.stop()
    assert want != original
    # Broadcast over Gloo, in chunks of about 16 KiB (several /update_weights calls).
    done = send_weights(dev_server, new_dir, "--chunk-mib", "0.015")
    assert done["weights_generation"] >= 1 and done["num_tensors"] > 0
    assert complete(dev_server) == want
    # Back to the bundled weights by folder path.
    send_weights(dev_server, MODEL_DIR, "--via-folder")
    assert complete(dev_server) == original
