"""POST /tokenize and /detokenize with the bundled tokenizer.

Expected ids come from Python tiktoken on models/tiny-kimi-k3/tiktoken.model (Kimi split
regex, specials at 768 + offset), as tools/make_bundled_tokenizer.py builds it.
"""

import pytest
import requests

pytestmark = pytest.mark.server

CASES = [
    ("Hello, world! The model server streams tokens.",
     [346, 44, 381, 33, 32, 299, 542, 437, 556, 115, 473, 115, 46]),
    ("你好，世界！今天天气怎么样？",
     [575, 586, 760, 290, 150, 231, 149, 140, 674, 637, 516, 516, 230, 176, 148, 736, 582, 744,
      309, 159]),
    ("def f(x):\n    return x * 2\n", [603, 273, 598, 605, 347, 606, 504, 602, 32, 50, 10]),
    ("<|im_user|>user<|im_middle|>Hi<|im_end|>", [771, 117, 374, 785, 72, 105, 770]),
]


@pytest.mark.parametrize("text,ids", CASES, ids=["english", "chinese", "code", "specials"])
def test_tokenize_matches_tiktoken(server, text, ids):
    r = requests.post(server.url("/tokenize"), json={"model": server.model, "prompt": text,
                                                     "add_special_tokens": False}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert body["tokens"] == ids
    assert body["count"] == len(ids)
    d = requests.post(server.url("/detokenize"), json={"model": server.model, "tokens": ids},
                      timeout=10)
    assert d.status_code == 200, d.text[:300]
    assert d.json()["prompt"] == text
