"""vLLM's serve flags that need a running server (issue 25, item 11): several
--served-model-name values, VLLM_API_KEY, --skip-tokenizer-init and the
VLLM_ALLOW_LONG_MAX_MODEL_LEN override. Flags refused before any weight loads are in
tests/cli_test.cpp."""

import subprocess

import openai
import pytest
import requests

from conftest import MODEL_DIR, REQUEST_TIMEOUT_S, assert_openai_error, binary_path, \
    free_port, server_environment, start_server

pytestmark = pytest.mark.server


def test_several_served_model_names(tmp_path):
    srv = start_server(tmp_path, ["--served-model-name", "main-name", "alias"])
    try:
        ids = [m["id"] for m in requests.get(srv.url("/v1/models"), timeout=10).json()["data"]]
        assert ids == ["main-name", "alias"]
        client = srv.client()
        for name in ("main-name", "alias"):
            r = client.completions.create(model=name, prompt="hi", max_tokens=1)
            assert r.model == "main-name"  # the first name is the one reported
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=MODEL_DIR.name, prompt="hi", max_tokens=1)
        metrics = requests.get(srv.url("/metrics"), timeout=10).text
        assert 'model_name="main-name"' in metrics and 'model_name="alias"' not in metrics
    finally:
        srv.stop()


def test_vllm_api_key_env_when_no_flag(tmp_path):
    srv = start_server(tmp_path, env={"VLLM_API_KEY": "from-env"}, api_key="from-env")
    try:
        url = srv.url("/v1/models")
        assert requests.get(url, timeout=10).status_code == 401
        ok = requests.get(url, headers={"Authorization": "Bearer from-env"}, timeout=10)
        assert ok.status_code == 200
    finally:
        srv.stop()
    # --api-key wins over the variable.
    srv = start_server(tmp_path, ["--api-key", "flag"], env={"VLLM_API_KEY": "from-env"},
                       api_key="flag")
    try:
        url = srv.url("/v1/models")
        assert requests.get(url, headers={"Authorization": "Bearer from-env"},
                            timeout=10).status_code == 401
        assert requests.get(url, headers={"Authorization": "Bearer flag"},
                            timeout=10).status_code == 200
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def no_tokenizer_dir(tmp_path_factory):
    """The bundled model without its tokenizer files."""
    folder = tmp_path_factory.mktemp("no-tokenizer") / "tiny-no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(MODEL_DIR / name)
    return folder


def test_a_checkpoint_without_tokenizer_needs_skip_tokenizer_init(no_tokenizer_dir, tmp_path):
    cmd = [str(binary_path()), "serve", str(no_tokenizer_dir), "--port", str(free_port())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=server_environment())
    assert r.returncode != 0
    assert "no tokenizer" in r.stderr + r.stdout
    assert "--skip-tokenizer-init" in r.stderr + r.stdout


def test_skip_tokenizer_init_serves_token_ids(no_tokenizer_dir, tmp_path):
    srv = start_server(tmp_path, ["--skip-tokenizer-init"], model_dir=no_tokenizer_dir)
    try:
        body = {"model": srv.model, "prompt": [300, 301, 302], "max_tokens": 4,
                "ignore_eos": True, "logprobs": 1, "return_token_ids": True}
        r = requests.post(srv.url("/v1/completions"), json=body, timeout=REQUEST_TIMEOUT_S)
        assert r.status_code == 200, r.text[:300]
        choice = r.json()["choices"][0]
        assert choice["text"] == ""
        assert len(choice["token_ids"]) == 4
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        for refused, param in (({"prompt": "text"}, "prompt"), ({"stop": ["x"]}, "stop"),
                               ({"echo": True}, "echo"),
                               ({"response_format": {"type": "json_object"}},
                                "response_format")):
            r = requests.post(srv.url("/v1/completions"), json={**body, **refused}, timeout=30)
            assert assert_openai_error(r, 400)["param"] == param, refused
        r = requests.post(srv.url("/v1/chat/completions"),
                          json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        assert_openai_error(r, 400)
        assert_openai_error(requests.post(srv.url("/tokenize"), json={"prompt": "hi"},
                                          timeout=30), 400)
    finally:
        srv.stop()


def test_greedy_ids_without_tokenizer_equal_those_with_one(server, no_tokenizer_dir, tmp_path):
    body = {"prompt": [300, 301, 302], "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    with_tokenizer = requests.post(server.url("/v1/completions"), json=body,
                                   timeout=REQUEST_TIMEOUT_S).json()["choices"][0]["token_ids"]
    srv = start_server(tmp_path, ["--skip-tokenizer-init"], model_dir=no_tokenizer_dir)
    try:
        r = requests.post(srv.url("/v1/completions"), json=body, timeout=REQUEST_TIMEOUT_S)
        assert r.json()["choices"][0]["token_ids"] == with_tokenizer
    finally:
        srv.stop()


def test_long_max_model_len_needs_the_override(tmp_path, server):
    longer = server.max_model_len * 2
    cmd = [str(binary_path()), "serve", str(MODEL_DIR), "--port", str(free_port()),
           "--max-model-len", str(longer)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=server_environment())
    assert r.returncode != 0
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in r.stderr + r.stdout
    srv = start_server(tmp_path, ["--max-model-len", str(longer)],
                       env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    try:
        assert srv.max_model_len == longer
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def config_only_dir(tmp_path_factory):
    """The bundled model's config and tokenizer, no weights."""
    folder = tmp_path_factory.mktemp("config-only") / "tiny-config-only"
    folder.mkdir()
    for f in MODEL_DIR.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (folder / f.name).symlink_to(f)
    return folder


def greedy_text(srv, prompt):
    r = srv.client().completions.create(model=srv.model, prompt=prompt, max_tokens=8,
                                        temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 8
    return r.choices[0].text


def test_load_format_dummy_serves_random_weights_of_the_config(config_only_dir, tmp_path):
    # vLLM's --load-format dummy: a folder with no weights serves (benchmarks of a model whose
    # checkpoint is not at hand); the same seed on every start, so the same greedy text.
    texts = []
    for _ in range(2):
        srv = start_server(tmp_path, ["--load-format", "dummy"], model_dir=config_only_dir)
        try:
            texts.append(greedy_text(srv, "The interpreter reads"))
            chat = srv.client().chat.completions.create(
                model=srv.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            assert chat.choices[0].finish_reason in ("length", "stop")
        finally:
            srv.stop()
    assert texts[0] == texts[1]
    # The real weights answer otherwise.
    srv = start_server(tmp_path)
    try:
        assert greedy_text(srv, "The interpreter reads") != texts[0]
    finally:
        srv.stop()


def test_load_format_refuses_unknown_values_and_a_folder_without_weights(config_only_dir):
    base = [str(binary_path()), "serve", str(config_only_dir), "--port", str(free_port())]
    r = subprocess.run(base + ["--load-format", "pickle"], capture_output=True, text=True,
                       timeout=60, env=server_environment())
    assert r.returncode != 0
    assert "--load-format must be auto, safetensors or dummy" in r.stderr + r.stdout
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, env=server_environment())
    assert r.returncode != 0
    assert "no .safetensors files" in r.stderr + r.stdout
