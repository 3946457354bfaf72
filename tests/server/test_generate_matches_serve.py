"""`hyserve generate` and `hyserve serve` run one engine, one model runner and one sampler:
the same prompt ids, sampling parameters and seed give the same token ids in both."""

import re
import subprocess

import pytest

from conftest import MODEL_DIR, binary_path

pytestmark = pytest.mark.server

PROMPT = [11, 27, 3, 400, 95, 12, 7, 8, 9, 300, 301, 302]


def generate_ids(max_tokens, temperature, seed):
    out = subprocess.run(
        [str(binary_path()), "generate", str(MODEL_DIR), "--prompt-ids",
         ",".join(map(str, PROMPT)), "--max-tokens", str(max_tokens), "--temperature",
         str(temperature), "--seed", str(seed), "--ignore-eos"],  # both at their defaults
        capture_output=True, text=True, timeout=120, check=True).stdout
    match = re.search(r"^ids:(.*)$", out, re.MULTILINE)
    assert match, out
    return [int(t) for t in match.group(1).split()]


def serve_ids(client, model, max_tokens, temperature, seed):
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=temperature, seed=seed,
        logprobs=0, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    tokens = r.choices[0].logprobs.tokens
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.split(":", 1)[1]) for t in tokens]


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.0, 7), (0.7, 123456789)])
def test_generate_equals_serve(server, client, temperature, seed):
    want = generate_ids(24, temperature, seed)
    assert len(want) == 24
    assert serve_ids(client, server.model, 24, temperature, seed) == want


def test_seeds_differ(server, client):
    # A check that the comparison above can fail: another seed draws other tokens.
    assert serve_ids(client, server.model, 24, 1.0, 7) != generate_ids(24, 1.0, 8)


def test_async_scheduling_equals_sync(server, client, tmp_path):
    """The default server schedules each step while the one before runs; a server started
    with --no-async-scheduling waits for each step's results. Concurrent seeded requests with
    penalties, logprobs and stop at EOS get the same tokens and logprobs from both."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import start_server

    def run_all(srv, cl):
        def one(i):
            r = cl.completions.create(
                model=srv.model, prompt=PROMPT[: 4 + i], max_tokens=10 + 3 * i,
                temperature=0.0 if i % 3 == 0 else 0.9, seed=1000 + i, logprobs=2,
                frequency_penalty=0.4 if i % 2 else 0.0,
                extra_body={"repetition_penalty": 1.2 if i % 4 == 1 else 1.0,
                            "return_tokens_as_token_ids": True, "min_tokens": i % 3})
            c = r.choices[0]
            return c.logprobs.tokens, c.logprobs.token_logprobs, c.finish_reason
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(8)))

    sync_server = start_server(tmp_path, ["--no-async-scheduling"])
    try:
        want = run_all(sync_server, sync_server.client())
    finally:
        sync_server.stop()
    assert run_all(server, client) == want
