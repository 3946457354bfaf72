"""Prefix caching through the server: on by default, counted in usage and /metrics, and a
hit gives the same greedy tokens and logprobs as the first (uncached) request."""

import pytest

from conftest import metric_sum, start_server, wait_idle

pytestmark = [pytest.mark.server]

# Long enough for two full blocks of the bundled model (128 tokens each).
PROMPT = " ".join(f"word{i}" for i in range(400))


def completion(client, model, prompt):
    return client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                     logprobs=2, extra_body={"ignore_eos": True})


def test_repeated_prompt_hits_the_cache_and_gives_the_same_output(server, client):
    wait_idle(server)
    hits_before = metric_sum(server, "vllm:prefix_cache_hits_total")
    first = completion(client, server.model, PROMPT)
    second = completion(client, server.model, PROMPT)
    wait_idle(server)
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens > 0
    assert details.cached_tokens % 128 == 0 and details.cached_tokens < second.usage.prompt_tokens
    assert metric_sum(server, "vllm:prefix_cache_hits_total") - hits_before == \
        details.cached_tokens
    assert second.choices[0].text == first.choices[0].text
    assert second.choices[0].logprobs.token_logprobs == first.choices[0].logprobs.token_logprobs


def test_no_enable_prefix_caching_turns_it_off(tmp_path):
    srv = start_server(tmp_path, extra_args=["--no-enable-prefix-caching"])
    try:
        client = srv.client()
        completion(client, srv.model, PROMPT)
        second = completion(client, srv.model, PROMPT)
        details = second.usage.prompt_tokens_details
        assert details is None or not details.cached_tokens
    finally:
        srv.stop()
