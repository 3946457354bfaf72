"""The bundled model's tokenizer: models/tiny-kimi-k3/tiktoken.model (+ tokenizer_config.json fields).

models/tiny-kimi-k3 has vocab_size 1024 = 768 base tokens + Kimi's 256 reserved special tokens.
The base vocabulary is a byte-level BPE in tiktoken format: ranks 0..255 are the single bytes,
ranks 256..767 are 512 merges trained with `tokenizers` (Kimi split regex, as
tools/make_tokenizer_fixtures.py does) on a small generated English / Chinese / code corpus,
rank = merge order. The special tokens follow in Kimi's reserved layout with N = 768
([BOS] 768, [EOS] 769, <|im_end|> 770, <|im_user|> 771, <|im_assistant|> 772,
<|im_system|> 778, tool-call markers 779..783, <|im_middle|> 785, <think> 790, </think> 791),
which src/tokenizer/tiktoken_tokenizer.cpp applies when tokenizer_config.json has no
added_tokens_decoder.

tokenizer_config.json: adds "bos_token" / "eos_token" (and keeps every existing field, the
chat template byte for byte).

Checks before writing: tiktoken round-trips a set of strings (encode then decode gives the
text back), special tokens encode to their ids, and every id is < config.json's vocab_size.

Deterministic: fixed seeds; a re-run reproduces every byte.
Usage: /work/venv/bin/python tools/make_bundled_tokenizer.py
"""

import base64
import json
import random
from pathlib import Path

import tiktoken
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from make_tokenizer_fixtures import byte_decoder

MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-kimi-k3"

NUM_BASE = 768
NUM_MERGES = NUM_BASE - 256
NUM_SPECIAL = 256

# Kimi's split regex exactly as tokenization_kimi.py gives it (Rust regex syntax with `&&`).
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

# Kimi's named reserved tokens (offsets from N), as in src/tokenizer/tiktoken_tokenizer.cpp.
KIMI_NAMED = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
    17: "<|im_middle|>", 18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>",
    21: "<|media_pad|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}

EN_WORDS = """the of and to in is that it for was on are as with his they at be this have from or
one had by word but not what all were we when your can said there use an each which she do how
their if will up other about out many then them these so some her would make like him into time
has look two more write go see number no way could people my than first water been call who
its now find long down day did get come made may part model server token request stream cache
hello world please answer question user assistant system tool weather city today tomorrow
thank you good great small tiny fast slow list count story write poem""".split()
EN_CAPS = ["I", "The", "We", "They", "Hello", "Please", "What", "How", "Why", "Kimi", "JSON"]
ZH = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
      "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面"
      "你好世界请问今天天气怎么样模型推理服务器缓存注意力专家路由")
ZH_PUNCT = "，。！？、：；（）"
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i];\n}\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "import json\nprint(json.dumps({\"a\": 1}))\n",
    "const x = await fetch(\"/v1/models\");\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
    "SELECT id, name FROM users WHERE age >= 18;\n",
]


def corpus_line(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return "".join(rng.choice(ZH) for _ in range(rng.randrange(4, 24))) + rng.choice(ZH_PUNCT)
    if kind == 1:
        return rng.choice(CODE)
    if kind == 2:
        return " ".join(str(rng.randrange(10 ** rng.randrange(1, 6))) for _ in range(3))
    words = [rng.choice(EN_CAPS)] + [rng.choice(EN_WORDS) for _ in range(rng.randrange(3, 14))]
    return " ".join(words) + rng.choice([".", "!", "?", ",", ":"])


def train_ranks(corpus):
    split = pre_tokenizers.Split(Regex(KIMI_PAT), behavior="isolated", invert=False)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # Generous target; the merge list is cut at NUM_MERGES below.
    trainer = trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    dec = byte_decoder()
    to_bytes = lambda s: bytes(dec[c] for c in s)
    ranks = {bytes([b]): b for b in range(256)}
    for merge in merges:
        if len(ranks) == NUM_BASE:
            break
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        ranks.setdefault(to_bytes(left) + to_bytes(right), len(ranks))
    if len(ranks) != NUM_BASE:
        raise SystemExit(f"training gave {len(ranks)} base tokens, need {NUM_BASE}")
    return ranks


def check(ranks, specials, vocab_size):
    enc = tiktoken.Encoding(name="tiny_kimi_k3", pat_str=KIMI_PAT, mergeable_ranks=ranks,
                            special_tokens=specials)
    rng = random.Random(99)
    texts = ["", "Hello, world!", "你好，世界！", "def f(x):\n    return x * 2\n",
             "Emoji 😀 and Привет", "\x00\x01\x02 bytes"]
    texts += [corpus_line(rng) for _ in range(200)]
    for text in texts:
        ids = enc.encode(text, disallowed_special=())
        if enc.decode(ids) != text:
            raise SystemExit(f"round trip failed for {text!r}")
        if any(i >= NUM_BASE for i in ids):
            raise SystemExit(f"ordinary text {text!r} encoded to a special id")
    chat = "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    ids = enc.encode(chat, allowed_special="all")
    for name in ("<|im_user|>", "<|im_middle|>", "<|im_end|>", "<|im_assistant|>"):
        if specials[name] not in ids:
            raise SystemExit(f"{name} did not encode to {specials[name]}")
    if enc.decode(ids) != chat:
        raise SystemExit("chat round trip failed")
    if enc.n_vocab != vocab_size:
        raise SystemExit(f"tokenizer has {enc.n_vocab} ids, config.json says {vocab_size}")


def main():
    config = json.loads((MODEL_DIR / "config.json").read_text())
    rng = random.Random(20261130)
    corpus = [corpus_line(rng) for _ in range(4000)]
    ranks = train_ranks(corpus)
    specials = {KIMI_NAMED.get(i, f"<|reserved_token_{NUM_BASE + i}|>"): NUM_BASE + i
                for i in range(NUM_SPECIAL)}
    check(ranks, specials, config["vocab_size"])

    lines = [f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()]
    (MODEL_DIR / "tiktoken.model").write_text("".join(lines))

    # Kimi's [BOS] and <|im_end|> (Kimi K2 uses <|im_end|> as eos). config.json's
    # bos_token_id / eos_token_id are reported by the check below when they disagree.
    config_path = MODEL_DIR / "tokenizer_config.json"
    text = config_path.read_text()
    tok_config = json.loads(text)
    tok_config["bos_token"] = "[BOS]"
    tok_config["eos_token"] = "<|im_end|>"
    tok_config["model_max_length"] = config["max_position_embeddings"]
    config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    if json.loads(config_path.read_text())["chat_template"] != json.loads(text)["chat_template"]:
        raise SystemExit("chat_template changed")
    for field, name in (("bos_token_id", "[BOS]"), ("eos_token_id", "<|im_end|>")):
        if config.get(field) != specials[name]:
            print(f"note: config.json {field} = {config.get(field)}, but {name} is "
                  f"{specials[name]} in this tokenizer")


if __name__ == "__main__":
    main()
