"""LoRA adapters through the server (issue 48), as vLLM serves them: --enable-lora,
--max-lora-rank, --max-loras, --lora-modules (name=path and the JSON form); `model` = an
adapter's name; /v1/models lists adapters with `parent` = the base model; the run-time
routes /v1/load_lora_adapter and /v1/unload_lora_adapter exist only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING; `load_inplace: true` replaces an adapter under its name.

The adapters are PEFT folders written here (adapter_config.json and a safetensors file
written by hand: 8-byte little-endian header length, JSON header, raw little-endian f32).
"""

import json
import random
import struct
from concurrent.futures import ThreadPoolExecutor

import requests

from conftest import MODEL_DIR, assert_openai_error, start_server

# (module path, out, in) of the tiny K3: every layer's o_proj and the dense MLP's down_proj.
MODULES = [(f"language_model.model.layers.{i}.self_attn.o_proj", 64, 64) for i in range(7)] + [
    ("language_model.model.layers.0.mlp.down_proj", 64, 128)]
PROMPT = "The capital of France is a city where"


def write_safetensors(path, tensors):
    header, data = {}, b""
    for name, shape, values in tensors:
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def write_adapter(folder, seed, rank=8, bad_shape=False):
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = []
    for k, (module, out, inp) in enumerate(MODULES):
        a = [rng.gauss(0.0, inp ** -0.5) for _ in range(rank * inp)]
        b_rows = out + 1 if bad_shape and k == 0 else out
        b = [rng.gauss(0.0, 0.5) for _ in range(b_rows * rank)]
        prefix = f"base_model.model.{module}"
        tensors.append((prefix + ".lora_A.weight", [rank, inp], a))
        tensors.append((prefix + ".lora_B.weight", [b_rows, rank], b))
    write_safetensors(folder / "adapter_model.safetensors", tensors)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"r": rank, "lora_alpha": 2 * rank, "target_modules": ["o_proj", "down_proj"],
         "peft_type": "LORA", "base_model_name_or_path": "tiny"}))
    return folder


def complete(server, model, prompt=PROMPT):
    r = requests.post(server.url("/v1/completions"), timeout=60, json={
        "model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1})
    return r


def result(server, model, prompt=PROMPT):
    r = complete(server, model, prompt)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == model
    choice = body["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def test_adapters_served_listed_and_mixed(tmp_path):
    x = write_adapter(tmp_path / "x", 1)
    y = write_adapter(tmp_path / "y", 2)
    spec_y = json.dumps({"name": "y", "path": str(y), "base_model_name": "tiny"})
    srv = start_server(tmp_path, ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                                  "--lora-modules", f"x={x}", spec_y])
    try:
        cards = {c["id"]: c for c in requests.get(srv.url("/v1/models"), timeout=10).json()["data"]}
        assert set(cards) == {srv.model, "x", "y"}
        assert cards[srv.model]["parent"] is None
        for name, folder in (("x", x), ("y", y)):
            assert cards[name]["parent"] == srv.model
            assert cards[name]["root"] == str(folder)
            assert cards[name]["object"] == "model"
            assert cards[name]["owned_by"] == cards[srv.model]["owned_by"]

        alone = {m: result(srv, m) for m in (srv.model, "x", "y")}
        assert alone["x"] != alone[srv.model] and alone["y"] != alone["x"]
        assert result(srv, "x") == alone["x"]  # deterministic

        # 8 threads, base and both adapters mixed in the engine's batches: each as alone.
        models = [srv.model, "x", "y"] * 4
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda m: result(srv, m), models))
        for m, g in zip(models, got):
            assert g == alone[m], m

        r = complete(srv, "nope")
        error = assert_openai_error(r, 404)
        assert error["message"] == "The model `nope` does not exist."
        # Without the variable the run-time routes do not exist.
        r = requests.post(srv.url("/v1/load_lora_adapter"), timeout=10,
                          json={"lora_name": "z", "lora_path": str(x)})
        assert r.status_code == 404
    finally:
        srv.stop()


def test_runtime_load_replace_unload(tmp_path):
    x = write_adapter(tmp_path / "x", 1)
    y = write_adapter(tmp_path / "y", 2)
    bad = write_adapter(tmp_path / "bad", 3, bad_shape=True)
    big = write_adapter(tmp_path / "big", 4, rank=32)
    srv = start_server(tmp_path, ["--enable-lora", "--lora-modules", f"x={x}"],
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    load = lambda body: requests.post(srv.url("/v1/load_lora_adapter"), json=body, timeout=30)
    unload = lambda body: requests.post(srv.url("/v1/unload_lora_adapter"), json=body, timeout=30)
    try:
        want_x = result(srv, "x")
        r = load({"lora_name": "z", "lora_path": str(x)})
        assert r.status_code == 200, r.text
        assert "z" in [c["id"] for c in requests.get(srv.url("/v1/models"), timeout=10).json()["data"]]
        assert result(srv, "z") == want_x  # the same weights under another name

        r = load({"lora_name": "z", "lora_path": str(y)})
        error = assert_openai_error(r, 400)
        assert error["message"] == "The lora adapter 'z' has already been loaded."
        r = load({"lora_name": "z", "lora_path": str(y), "load_inplace": True})
        assert r.status_code == 200, r.text
        replaced = result(srv, "z")
        assert replaced != want_x
        assert result(srv, "x") == want_x

        error = assert_openai_error(load({"lora_name": "b", "lora_path": str(bad)}), 400)
        assert "lora_B" in error["message"] and "o_proj" in error["message"], error
        error = assert_openai_error(load({"lora_name": "b", "lora_path": str(big)}), 400)
        assert "32" in error["message"], error
        assert_openai_error(load({"lora_name": "b", "lora_path": str(tmp_path / "none")}), 400)
        assert_openai_error(load({"lora_name": "b"}), 400)

        assert unload({"lora_name": "z"}).status_code == 200
        assert_openai_error(complete(srv, "z"), 404)
        error = assert_openai_error(unload({"lora_name": "z"}), 404)
        assert "z" in error["message"]
    finally:
        srv.stop()


def test_adapter_name_without_enable_lora_is_unknown(server):
    error = assert_openai_error(complete(server, "x"), 404)
    assert error["message"] == "The model `x` does not exist."
