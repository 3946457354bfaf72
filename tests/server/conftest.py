"""Fixtures of the server suite: a real `hyserve serve` process on a free local port.

The binary is $HYSERVE_BINARY (default build/hyserve, relative to the repository root); the
model is the bundled models/tiny-kimi-k3. One server is shared by the whole session; tests
that need other flags (--api-key) or another model folder start their own through
`start_server`. Every wait is bounded; a server that dies or never becomes healthy fails the
fixture with its log tail.
"""

import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from openai import OpenAI

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO_ROOT / "models" / "tiny-kimi-k3"
STARTUP_TIMEOUT_S = float(os.environ.get("HYSERVE_STARTUP_TIMEOUT", "60"))
REQUEST_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 4000


def binary_path():
    path = Path(os.environ.get("HYSERVE_BINARY", "build/hyserve"))
    return path if path.is_absolute() else REPO_ROOT / path


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path):
    text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
    return text[-LOG_TAIL_CHARS:]


@dataclass
class Server:
    proc: subprocess.Popen
    base_url: str  # http://127.0.0.1:PORT
    log_path: Path
    model: str  # the served model name, from GET /v1/models
    max_model_len: int

    def url(self, route):
        return self.base_url + route

    def client(self, api_key="x"):
        return OpenAI(base_url=self.base_url + "/v1", api_key=api_key,
                      timeout=REQUEST_TIMEOUT_S, max_retries=0)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


# Every hyserve this suite starts multiplies in the CPU reference's fixed order unless a test
# asks for OpenBLAS (--cpu-gemm blas, test_cpu_gemm.py): the suite's exact equalities (async
# equals sync, speculation changes no logprob, generate equals serve) are properties of the
# engine, which the reference checks bit for bit; OpenBLAS's order may depend on the batch.
os.environ["HYSERVE_CPU_GEMM"] = "reference"


def server_environment():
    """This process's environment without the vLLM variables hyserve serve reads
    (VLLM_API_KEY, VLLM_ALLOW_LONG_MAX_MODEL_LEN, VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so a test
    sets them only on purpose."""
    return {k: v for k, v in os.environ.items()
            if k not in ("VLLM_API_KEY", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
                         "VLLM_HTTP_TIMEOUT_KEEP_ALIVE")}


def check_binary():
    binary = binary_path()
    if not binary.exists():
        pytest.fail(f"hyserve binary not found at {binary} (set HYSERVE_BINARY or build it: "
                    "cmake -S . -B build -G Ninja -DHYSERVE_CUDA=OFF && cmake --build build)",
                    pytrace=False)
    try:
        probe = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True,
                               timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{binary} serve --help` did not return within 20 s", pytrace=False)
    output = probe.stdout + probe.stderr
    # CLI11 answers an unknown subcommand's --help with the top-level help (exit 0).
    if probe.returncode != 0 or not re.search(r"Usage:.*\bserve\b", output):
        pytest.fail(f"{binary} has no `serve` subcommand (`serve --help` exited "
                    f"{probe.returncode} without a `serve` usage line):\n"
                    f"{output[-LOG_TAIL_CHARS:]}", pytrace=False)
    return binary


def start_server(log_dir, extra_args=(), api_key=None, model_dir=MODEL_DIR, env=None, cpus=None):
    """`env`: variables added to the server's environment; `cpus`: the CPUs the server may run
    on (all of this process's when None)."""
    binary = check_binary()
    port = free_port()
    log_path = Path(log_dir) / f"hyserve-{port}.log"
    cmd = [str(binary), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
           *extra_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env={**server_environment(), **(env or {})},
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    healthy = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"`{' '.join(cmd)}` exited with {proc.returncode} before /health "
                        f"answered 200. Log tail:\n{log_tail(log_path)}", pytrace=False)
        try:
            if requests.get(base_url + "/health", timeout=2).status_code == 200:
                healthy = True
                break
        except requests.RequestException:
            pass
        time.sleep(0.2)
    if not healthy:
        proc.kill()
        proc.wait(timeout=15)
        pytest.fail(f"`{' '.join(cmd)}`: GET /health did not return 200 within "
                    f"{STARTUP_TIMEOUT_S:.0f} s. Log tail:\n{log_tail(log_path)}", pytrace=False)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        models = requests.get(base_url + "/v1/models", headers=headers, timeout=10).json()
        card = models["data"][0]
    except Exception as e:  # noqa: BLE001 - any failure here is a fixture failure
        proc.kill()
        proc.wait(timeout=15)
        pytest.fail(f"GET /v1/models failed after startup: {e!r}. Log tail:\n"
                    f"{log_tail(log_path)}", pytrace=False)
    max_model_len = card.get("max_model_len") or 4096
    return Server(proc, base_url, log_path, card["id"], int(max_model_len))


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    return server.client()


# ---- Helpers shared by the test files ---------------------------------------------------

CHAT = [{"role": "user", "content": "Hello! Please tell me a short story about a city."}]
# Reasoning off: the answer is `content` (the template otherwise opens a <think> block).
NO_THINK = {"chat_template_kwargs": {"thinking": False}}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_samples(text, name):
    """[(labels_text, value)] for every sample of metric `name` in Prometheus text."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out.append((m.group(2) or "", float(m.group(3))))
    return out


def metric_sum(server, name):
    text = requests.get(server.url("/metrics"), timeout=10).text
    return sum(v for labels, v in metric_samples(text, name)
               if f'model_name="{server.model}"' in labels)


def wait_idle(server, timeout_s=20.0):
    """Waits until vllm:num_requests_running is 0; returns the seconds it took."""
    start = time.monotonic()
    while True:
        running = metric_sum(server, "vllm:num_requests_running")
        if running == 0:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"vllm:num_requests_running is still {running} after "
                                 f"{timeout_s:.0f} s")
        time.sleep(0.1)


def assert_openai_error(response, status):
    assert response.status_code == status, (
        f"expected HTTP {status}, got {response.status_code}: {response.text[:500]}")
    body = response.json()
    assert "error" in body, f"no 'error' object in {body}"
    error = body["error"]
    assert error.get("code") == status, f"error.code should be {status}: {error}"
    assert isinstance(error.get("type"), str) and error["type"], f"error.type missing: {error}"
    assert isinstance(error.get("message"), str) and error["message"], (
        f"error.message missing: {error}")
    return error
