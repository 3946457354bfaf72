"""`serve --batch-invariant` through the OpenAI SDK: a request's greedy tokens and logprobs
are the same alone, among concurrent requests (its prefill chunks mixed with their decode
steps) and when its prefix comes from the cache."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import start_server, wait_idle

pytestmark = [pytest.mark.server]

PROMPTS = [" ".join(f"w{i * 7 + j}" for j in range(n)) for i, n in enumerate((3, 40, 150, 300))]


def completion(client, model, prompt):
    out = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0,
                                    logprobs=2, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    return choice.text, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs


def test_concurrent_and_cached_requests_equal_the_request_alone(tmp_path):
    # A small token budget so that the concurrent prompts are chunked and share steps.
    srv = start_server(tmp_path, extra_args=["--batch-invariant", "--max-num-batched-tokens",
                                             "128"])
    try:
        client = srv.client()
        alone = [completion(client, srv.model, p) for p in PROMPTS]
        wait_idle(srv)
        with ThreadPoolExecutor(max_workers=len(PROMPTS) * 2) as pool:
            together = list(pool.map(lambda p: completion(client, srv.model, p), PROMPTS * 2))
        assert together == alone * 2
    finally:
        srv.stop()
