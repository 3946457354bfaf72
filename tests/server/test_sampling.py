"""Determinism (temperature 0, seed), logprobs, stop strings."""

import re

import pytest
import requests

from conftest import CHAT, NO_THINK

pytestmark = pytest.mark.server

SPECIAL = re.compile(r"<\|[^|]+\|>|\[[A-Z]+\]")


def test_temperature0_deterministic(server, client):
    outs = [client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=16,
                                           temperature=0, extra_body=NO_THINK)
            .choices[0].message.content for _ in range(2)]
    assert outs[0] == outs[1]
    texts = [client.completions.create(model=server.model, prompt="Hello world", max_tokens=16,
                                       temperature=0).choices[0].text for _ in range(2)]
    assert texts[0] == texts[1]


def test_seed_reproduces(server, client):
    outs = [client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=16,
                                           temperature=1.0, seed=7,
                                           extra_body={"ignore_eos": True, **NO_THINK})
            .choices[0].message.content for _ in range(2)]
    assert outs[0] == outs[1]
    texts = [client.completions.create(model=server.model, prompt="Hello world", max_tokens=16,
                                       temperature=1.0, seed=7,
                                       extra_body={"ignore_eos": True}).choices[0].text
             for _ in range(2)]
    assert texts[0] == texts[1]


def test_chat_logprobs(server, client):
    r = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True, **NO_THINK})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for i, entry in enumerate(content):
        assert entry.logprob <= 0.0
        tops = entry.top_logprobs
        assert len(tops) == 3, f"token {i}: {len(tops)} top_logprobs"
        values = [t.logprob for t in tops]
        assert values == sorted(values, reverse=True), f"token {i}: not descending: {values}"
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(values[0], abs=1e-4), f"token {i}"
        for t in tops:
            assert isinstance(t.token, str)
            assert t.bytes is None or isinstance(t.bytes, list)


def test_completion_logprobs(server, client):
    r = client.completions.create(model=server.model, prompt="The weather today", max_tokens=5,
                                  logprobs=2, seed=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert len(lp.text_offset) == 5
    assert lp.text_offset == sorted(lp.text_offset)
    # Text skips special tokens, `tokens` names them; partial UTF-8 has no exact text.
    plain = [t for t in lp.tokens if not SPECIAL.fullmatch(t)]
    if r.choices[0].text.isascii():
        assert "".join(plain) == r.choices[0].text
    for i, (chosen, tops) in enumerate(zip(lp.token_logprobs, lp.top_logprobs)):
        assert chosen <= 0.0
        # The top 2, plus the sampled token when it is not among them; tokens with the same
        # text (several partial UTF-8 bytes are all U+FFFD) share one key of the dict.
        assert 1 <= len(tops) <= 3, f"token {i}: {tops}"
        if not any("\ufffd" in t for t in tops):
            assert len(tops) >= 2, f"token {i}: {tops}"
        assert max(tops.values()) >= chosen - 1e-4, f"token {i}: {chosen} vs {tops}"


def test_stop_string(server, client):
    prompt = "Write a list of words: the model server token"
    full = client.completions.create(model=server.model, prompt=prompt, max_tokens=32,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    # A short printable-ASCII stop string at its first occurrence, after a non-empty prefix
    # that does not end in a partial UTF-8 character (random weights emit those as U+FFFD).
    stop = None
    for start in range(1, len(text) - 2):
        cand = text[start:start + 2]
        if all(33 <= ord(ch) < 127 for ch in cand) and text[start - 1] != "\ufffd" \
                and text.find(cand) == start:
            stop = cand
            break
    if stop is None:
        pytest.skip(f"no usable stop string in the greedy output {text!r}")
    r = client.completions.create(model=server.model, prompt=prompt, max_tokens=32,
                                  temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "stop", f"stop={stop!r} full={text!r} got={c.text!r}"
    assert c.text == text[:text.find(stop)], f"stop={stop!r} full={text!r}"
    stop_reason = (c.model_extra or {}).get("stop_reason")
    assert stop_reason in (None, stop)


def test_completion_prompt_logprobs(server, client):
    prompt = "The weather today is"
    r = client.completions.create(model=server.model, prompt=prompt, max_tokens=2,
                                  extra_body={"prompt_logprobs": 2})
    ids = requests.post(server.url("/tokenize"), json={"prompt": prompt},
                        timeout=30).json()["tokens"]
    plp = (r.choices[0].model_extra or {}).get("prompt_logprobs")
    assert plp is not None and len(plp) == len(ids)
    assert plp[0] is None
    for pos, entry in zip(ids[1:], plp[1:]):
        assert str(pos) in entry, entry
        assert entry[str(pos)]["logprob"] <= 0.0
        assert entry[str(pos)]["rank"] >= 1
        assert any(v["rank"] == 1 for v in entry.values()), entry
