"""EOS (<|im_end|>, the tokenizer's eos_token), ignore_eos, min_tokens and stop_token_ids.

logit_bias +100 makes one token all but certain, so these hold even with random weights.
"""

import pytest
import requests

pytestmark = pytest.mark.server

IM_END = 770  # <|im_end|>: 768 base tokens + offset 2
TOKEN = 500  # an ordinary base token


def complete(server, client, **kwargs):
    return client.completions.create(model=server.model, prompt="Hi", max_tokens=8, **kwargs)


def token_text(server, token):
    r = requests.post(server.url("/detokenize"), json={"model": server.model, "tokens": [token]},
                      timeout=10)
    assert r.status_code == 200, r.text[:300]
    return r.json()["prompt"]


def test_im_end_stops(server, client):
    r = complete(server, client, logit_bias={str(IM_END): 100})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert r.usage.completion_tokens == 1
    assert c.text == ""


# vLLM reports stop_reason None when EOS ends a request.
def test_im_end_stop_reason_is_none(server, client):
    r = complete(server, client, logit_bias={str(IM_END): 100})
    assert (r.choices[0].model_extra or {}).get("stop_reason") is None


def test_ignore_eos_runs_past_im_end(server, client):
    r = complete(server, client, logit_bias={str(IM_END): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8


def test_min_tokens_holds_back_eos(server, client):
    r = complete(server, client, logit_bias={str(IM_END): 100}, extra_body={"min_tokens": 4})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 5  # 4 others, then <|im_end|>


def test_stop_token_ids(server, client):
    r = complete(server, client, logit_bias={str(TOKEN): 100},
                 extra_body={"stop_token_ids": [TOKEN]})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert r.usage.completion_tokens == 1
    assert (c.model_extra or {}).get("stop_reason") == TOKEN


# vLLM leaves a stop token's text out unless include_stop_str_in_output.
def test_stop_token_text_excluded(server, client):
    r = complete(server, client, logit_bias={str(TOKEN): 100},
                 extra_body={"stop_token_ids": [TOKEN]})
    assert r.choices[0].text == ""


def test_stop_token_text_included_when_asked(server, client):
    r = complete(server, client, logit_bias={str(TOKEN): 100},
                 extra_body={"stop_token_ids": [TOKEN], "include_stop_str_in_output": True})
    assert r.choices[0].text == token_text(server, TOKEN)
