"""`serve --speculative-config` through the OpenAI SDK: with prompt-lookup (ngram) drafts a
request's tokens and logprobs are the same as without speculation (greedy and seeded
sampling), streamed or not, and /metrics counts the drafts as vLLM does
(vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total and
_num_accepted_tokens_per_pos_total{position})."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import metric_samples, start_server, wait_idle

pytestmark = [pytest.mark.server]

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                    "prompt_lookup_max": 3})
PROMPTS = ["one two three one two three one two", "a b c d a b c d a b", "hello world " * 6,
           "x y z"]
# A tiny random model's outputs hardly repeat: biased tokens make them cycle, so that drafts are
# accepted (and some rejected where the model picks another of the biased tokens).
BIAS = {"17": 30, "29": 30, "101": 30}


def completion(client, model, prompt, temperature, seed, bias, stream=False):
    kwargs = dict(model=model, prompt=prompt, max_tokens=24, temperature=temperature, seed=seed,
                  logprobs=1, extra_body={"ignore_eos": True})
    if bias:
        kwargs["logit_bias"] = BIAS
    if not stream:
        choice = client.completions.create(**kwargs).choices[0]
        return choice.text, choice.logprobs.tokens, choice.logprobs.token_logprobs
    text, tokens, logprobs = "", [], []
    for chunk in client.completions.create(stream=True, **kwargs):
        c = chunk.choices[0]
        text += c.text
        if c.logprobs:
            tokens += c.logprobs.tokens
            logprobs += c.logprobs.token_logprobs
    return text, tokens, logprobs


def spec_metrics(srv):
    text = requests.get(srv.url("/metrics"), timeout=10).text
    out = {}
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        out[name] = sum(v for _, v in metric_samples(text, name))
    out["per_pos"] = {labels: v for labels, v in
                      metric_samples(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total")}
    return out


def test_ngram_speculation_gives_the_same_tokens_and_counts_drafts(tmp_path, server):
    plain = server.client()
    srv = start_server(tmp_path, extra_args=["--speculative-config", NGRAM])
    try:
        spec = srv.client()
        cases = [(p, t, s, b) for p in PROMPTS for (t, s) in ((0.0, None), (0.9, 7))
                 for b in (False, True)]
        for prompt, temperature, seed, bias in cases:
            want = completion(plain, server.model, prompt, temperature, seed, bias)
            got = completion(spec, srv.model, prompt, temperature, seed, bias)
            assert got == want, (prompt, temperature, bias)
            streamed = completion(spec, srv.model, prompt, temperature, seed, bias, stream=True)
            assert streamed[0] == want[0] and streamed[1] == want[1], (prompt, temperature, bias)
        # Concurrent requests share verification steps: still the same tokens.
        with ThreadPoolExecutor(max_workers=8) as pool:
            together = list(pool.map(
                lambda c: completion(spec, srv.model, c[0], c[1], c[2], c[3]), cases))
        assert together == [completion(plain, server.model, *c) for c in cases]
        wait_idle(srv)
        m = spec_metrics(srv)
        drafts = m["vllm:spec_decode_num_drafts_total"]
        draft_tokens = m["vllm:spec_decode_num_draft_tokens_total"]
        accepted = m["vllm:spec_decode_num_accepted_tokens_total"]
        assert drafts > 0 and draft_tokens >= drafts
        assert 0 < accepted < draft_tokens
        per_pos = m["per_pos"]
        assert sorted(labels.split('position="')[1].split('"')[0] for labels in per_pos) == \
            ["0", "1", "2", "3"]
        assert sum(per_pos.values()) == accepted
        by_pos = [per_pos[k] for k in sorted(per_pos, key=lambda s: s.split('position="')[1])]
        assert by_pos == sorted(by_pos, reverse=True)
    finally:
        srv.stop()
    # Without speculation the counters stay 0.
    m = spec_metrics(server)
    assert m["vllm:spec_decode_num_drafts_total"] == 0


def test_stop_strings_and_short_requests_as_without_speculation(tmp_path, server):
    plain = server.client()
    srv = start_server(tmp_path, extra_args=["--speculative-config", NGRAM])
    try:
        spec = srv.client()
        for prompt in PROMPTS[:3]:
            full = plain.completions.create(model=server.model, prompt=prompt, max_tokens=24,
                                            temperature=0, logit_bias=BIAS,
                                            extra_body={"ignore_eos": True}).choices[0].text
            # A stop string from the middle of the output: both cut there, finish "stop".
            stop = full[len(full) // 2:len(full) // 2 + 3]
            if not stop.strip():
                continue
            outs = [c.completions.create(model=m, prompt=prompt, max_tokens=24, temperature=0,
                                         logit_bias=BIAS, stop=[stop],
                                         extra_body={"ignore_eos": True}).choices[0]
                    for c, m in ((plain, server.model), (spec, srv.model))]
            assert outs[0].text == outs[1].text, (prompt, stop)
            assert outs[0].finish_reason == outs[1].finish_reason == "stop"
            # max_tokens 1 and 2 leave no room for drafts; n = 2 samples two sequences.
            for max_tokens in (1, 2):
                a, b = (c.completions.create(model=m, prompt=prompt, max_tokens=max_tokens,
                                             temperature=0, extra_body={"ignore_eos": True})
                        for c, m in ((plain, server.model), (spec, srv.model)))
                assert a.choices[0].text == b.choices[0].text
                assert b.usage.completion_tokens == max_tokens
            a, b = (c.completions.create(model=m, prompt=prompt, max_tokens=16, temperature=0.8,
                                         seed=3, n=2, logit_bias=BIAS,
                                         extra_body={"ignore_eos": True})
                    for c, m in ((plain, server.model), (spec, srv.model)))
            assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    finally:
        srv.stop()
