"""/v1/completions `echo` with `logprobs` and prompt scoring (issue 25, item 7), as vLLM and
OpenAI: the prompt's tokens lead `logprobs` (the first with a null logprob and null
top_logprobs), `text_offset`s index the whole echoed text, and `max_tokens: 0` with echo
returns the prompt with its logprobs and no generated token (a 400 without echo)."""

import pytest
import requests

from conftest import assert_openai_error

pytestmark = pytest.mark.server

PROMPT = "The quick brown fox jumps"


def prompt_ids(server, text=PROMPT):
    r = requests.post(server.url("/tokenize"), json={"prompt": text}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def check_offsets(logprobs, text):
    """Offsets start at 0 and advance by each token's length, within the returned text."""
    offset = 0
    for token, at in zip(logprobs.tokens, logprobs.text_offset):
        assert at == offset
        offset += len(token)
    assert "".join(logprobs.tokens) == text[:offset]


def collect_stream(client, body):
    """Text, tokens, offsets, token logprobs and the last finish_reason of a streamed
    completion, joined across chunks."""
    text, tokens, offsets, token_logprobs, finish = "", [], [], [], None
    for chunk in client.completions.create(stream=True, **body):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
                token_logprobs += choice.logprobs.token_logprobs
            finish = choice.finish_reason or finish
    return text, tokens, offsets, token_logprobs, finish


def test_echo_with_logprobs_includes_the_prompt_tokens(server, client):
    ids = prompt_ids(server)
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4,
                                  temperature=0, echo=True, logprobs=2,
                                  extra_body={"ignore_eos": True})
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT)
    assert len(lp.tokens) == len(ids) + 4 == len(lp.token_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens[:len(ids)]) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs[1:])
    check_offsets(lp, choice.text)
    assert lp.text_offset[len(ids)] == len(PROMPT)  # the first generated token
    # The prompt's logprobs are those prompt_logprobs reports (vLLM sends it too).
    prompt_logprobs = choice.model_extra["prompt_logprobs"]
    assert prompt_logprobs[0] is None
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(prompt_logprobs[i][str(ids[i])]["logprob"])
    # The generated part equals a request without echo.
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4,
                                      temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs.tokens == lp.tokens[len(ids):]
    assert plain.choices[0].logprobs.text_offset[0] == 0
    assert r.usage.completion_tokens == 4


def test_streamed_echo_logprobs_equal_the_full_response(server, client):
    body = dict(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, echo=True,
                logprobs=1, extra_body={"ignore_eos": True})
    full = client.completions.create(**body).choices[0]
    text, tokens, offsets, token_logprobs, _ = collect_stream(client, body)
    assert text == full.text
    assert tokens == full.logprobs.tokens
    assert offsets == full.logprobs.text_offset
    assert token_logprobs == pytest.approx(full.logprobs.token_logprobs)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_with_echo_scores_the_prompt(server, client, stream):
    ids = prompt_ids(server)
    body = dict(model=server.model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    if not stream:
        r = client.completions.create(**body)
        (choice,) = r.choices
        text, lp = choice.text, choice.logprobs
        tokens, offsets, token_logprobs = lp.tokens, lp.text_offset, lp.token_logprobs
        finish = choice.finish_reason
        assert r.usage.completion_tokens == 0
        assert r.usage.prompt_tokens == len(ids)
    else:
        text, tokens, offsets, token_logprobs, finish = collect_stream(client, body)
    assert text == PROMPT
    assert "".join(tokens) == PROMPT and len(tokens) == len(ids)
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert token_logprobs[0] is None
    assert all(isinstance(x, float) for x in token_logprobs[1:])
    assert finish == "length"


def test_max_tokens_zero_scores_token_prompts_and_n(server, client):
    ids = prompt_ids(server)
    r = client.completions.create(model=server.model, prompt=[ids, ids[:3]], max_tokens=0,
                                  echo=True, logprobs=0, n=2)
    assert len(r.choices) == 4
    for i, choice in enumerate(r.choices):
        expected = ids if i < 2 else ids[:3]
        assert len(choice.logprobs.tokens) == len(expected)
        assert choice.logprobs.token_logprobs[0] is None
        assert choice.text == "".join(choice.logprobs.tokens)
    assert r.usage.completion_tokens == 0
    # Without logprobs: the prompt alone.
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=0, echo=True)
    assert r.choices[0].text == PROMPT and r.choices[0].logprobs is None
    assert r.usage.completion_tokens == 0


def test_max_tokens_zero_without_echo_is_a_400(server):
    r = requests.post(server.url("/v1/completions"),
                      json={"model": server.model, "prompt": PROMPT, "max_tokens": 0},
                      timeout=30)
    assert assert_openai_error(r, 400)["param"] == "max_tokens"
    r = requests.post(server.url("/v1/completions"),
                      json={"model": server.model, "prompt": PROMPT, "max_tokens": 0,
                            "echo": True, "min_tokens": 2}, timeout=30)
    assert assert_openai_error(r, 400)["param"] == "min_tokens"


def test_echo_of_a_partial_character_is_u_fffd(server, client):
    """Issue 49: token 168 is one byte of a multi-byte character; echoing it alone answered
    500 (invalid UTF-8) without streaming. Both ways it is U+FFFD, as vLLM's detokenizer."""
    body = dict(model=server.model, prompt=[168], max_tokens=0, echo=True, logprobs=1)
    full = client.completions.create(**body).choices[0]
    assert full.text == "\ufffd"
    assert full.logprobs.tokens == ["\ufffd"]
    text, tokens, _, _, _ = collect_stream(client, body)
    assert text == full.text and tokens == full.logprobs.tokens
