"""Zero-mismatch RL over HTTP (issue 48, item 3): under `serve --batch-invariant` a rollout's
sampled-token logprobs (/v1/completions with logprobs, temperature 1, a seed) equal, bit for
bit, the same tokens' logprobs when the completed rollout (prompt ids + sampled ids) is scored
in one prefill, both by `echo` + `logprobs` + `max_tokens: 0` and by `prompt_logprobs`, for
rollouts run alone and concurrently, with and without ngram speculation. The JSON floats are compared exactly: each must be a
float32 the server printed with enough digits to round-trip."""

import json
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import REQUEST_TIMEOUT_S, start_server

pytestmark = [pytest.mark.server]


def as_float32(x):
    """x exactly as the float32 it must be (the server's logprobs are float32)."""
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    assert f == x, f"{x!r} is not a float32 printed to round-trip"
    return f


def post(srv, body):
    r = requests.post(srv.url("/v1/completions"), json={"model": srv.model, **body},
                      timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def rollout(srv, prompt, seed, max_tokens):
    choice = post(srv, {"prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0,
                        "seed": seed, "logprobs": 0, "ignore_eos": True,
                        "return_token_ids": True})
    ids = choice["token_ids"]
    lps = [as_float32(x) for x in choice["logprobs"]["token_logprobs"]]
    assert len(ids) == len(lps) == max_tokens
    return ids, lps


def scored_by_echo(srv, prompt, ids):
    choice = post(srv, {"prompt": prompt + ids, "max_tokens": 0, "echo": True, "logprobs": 0})
    lps = choice["logprobs"]["token_logprobs"]
    assert len(lps) == len(prompt) + len(ids) and lps[0] is None
    return [as_float32(x) for x in lps[len(prompt):]]


def scored_by_prompt_logprobs(srv, prompt, ids):
    choice = post(srv, {"prompt": prompt + ids, "max_tokens": 1, "prompt_logprobs": 0})
    entries = choice["prompt_logprobs"][len(prompt):]
    assert len(entries) == len(ids)
    return [as_float32(e[str(t)]["logprob"]) for e, t in zip(entries, ids)]


NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                    "prompt_lookup_max": 2})


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "ngram"])
def test_rollout_logprobs_equal_scored_logprobs_bit_for_bit(tmp_path, speculative):
    # A small token budget: the longer prompts are chunked and share steps with decodes.
    args = ["--batch-invariant", "--max-num-batched-tokens", "128"]
    if speculative:
        args += ["--speculative-config", NGRAM]
    srv = start_server(tmp_path, extra_args=args)
    try:
        shared = [(i * 37) % 700 + 3 for i in range(128)]  # a shared prefix: prefix hits
        prompts = [shared + [(i * 11 + j * 5) % 700 + 3 for j in range(n)]
                   for i, n in enumerate((1, 30, 70, 5))] + [[5, 6, 7]]
        jobs = [(p, 100 + i, 8 + 4 * i) for i, p in enumerate(prompts)]
        alone = [rollout(srv, *job) for job in jobs]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            together = list(pool.map(lambda job: rollout(srv, *job), jobs))
        # Seeded: the same tokens and logprobs alone and in a batch.
        assert together == alone
        with ThreadPoolExecutor(max_workers=2 * len(jobs)) as pool:
            echo = pool.map(lambda i: scored_by_echo(srv, prompts[i], alone[i][0]),
                            range(len(jobs)))
            plp = pool.map(lambda i: scored_by_prompt_logprobs(srv, prompts[i], alone[i][0]),
                           range(len(jobs)))
            for (ids, lps), by_echo, by_plp in zip(alone, list(echo), list(plp)):
                assert by_echo == lps
                assert by_plp == lps
                assert sum(a - b for a, b in zip(lps, by_echo)) == 0.0
    finally:
        srv.stop()
