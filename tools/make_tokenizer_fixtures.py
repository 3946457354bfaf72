"""Tokenizer fixtures: small trained vocabularies plus the ids the Python packages produce.

The C++ tokenizers (src/tokenizer/) must agree bit for bit with `tiktoken` (Kimi's
tiktoken.model format) and with `tokenizers` (DeepSeek's tokenizer.json). This script
trains two small byte-level BPE vocabularies on a generated multilingual corpus and writes,
under tests/fixtures/tokenizer/:

  cases.json            {"strings": [...]}  the test strings (about 200)
  kimi/tiktoken.model   base64(token bytes) rank; ranks 0..255 are the single bytes, then
                        merge order; special tokens follow in Kimi's reserved layout
  kimi/expected.json    ids from tiktoken.Encoding(pat_str=Kimi regex, ...)
  deepseek/tokenizer.json  Split(DeepSeek V3 regexes, Isolated) x3 + ByteLevel(use_regex=false)
  deepseek/expected.json   ids from tokenizers
  gpt2/tokenizer.json   the same vocabulary, pre-tokenizer ByteLevel(use_regex=true) only
  gpt2/expected.json

expected.json: {"vocab_size", "special": {content: id}, "encode_special": [[ids]] (special
tokens parsed), "encode_plain": [[ids]] (special tokens are plain text), "pieces": [[str]]
(the pre-tokenizer's pieces of each whole string), "decode": [{"ids", "skip_special",
"text"}] (text = the package's decode, invalid UTF-8 as U+FFFD)}.

A small vocabulary hides split differences (no token spans the boundary that a wrong split
would move), hence "pieces": from tokenizers' pre_tokenize_str, and for Kimi from the
`regex` module (V1, which reads `&&`), checked against tiktoken's own split by encoding
with a probe vocabulary made of exactly those pieces.

Deterministic: fixed seeds; a re-run reproduces every file byte for byte.
Usage: /work/venv/bin/python tools/make_tokenizer_fixtures.py
"""

import base64
import json
import random
from pathlib import Path

import regex
import tiktoken
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizer"

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

# DeepSeek V3's tokenizer.json pre-tokenizer split regexes.
DEEPSEEK_PATS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

NUM_KIMI_SPECIAL = 256
# Kimi's named reserved tokens (offsets from the base vocabulary size), as in Kimi K2.
KIMI_NAMED = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
    17: "<|im_middle|>", 18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>",
    21: "<|media_pad|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
KIMI_NOT_SKIPPED = {"<think>", "</think>"}

DEEPSEEK_SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                    "<｜Assistant｜>", "<|im_end|>"]
DEEPSEEK_ADDED = ["<think>", "</think>"]  # added, not special (DeepSeek R1 style)

EN_WORDS = """the of and to in is that it for was on are as with his they at be this have from or
one had by word but not what all were we when your can said there use an each which she do how
their if will up other about out many then them these so some her would make like him into time
has look two more write go see number no way could people my than first water been call who oil
its now find long down day did get come made may part model server token request stream cache
latency throughput batch prefix attention expert router layer kernel memory thread queue""".split()
EN_CAPS = ["I", "The", "We", "They", "Hello", "OpenAI", "GPU", "JSON", "HTTP", "McDonald",
           "iPhone", "NASA", "Kimi", "DeepSeek", "CamelCase", "ALLCAPS"]
CONTRACTIONS = ["I'm", "you're", "they'll", "we've", "it's", "don't", "I'd", "She'S", "WE'LL",
                "can't", "o'clock", "rock'n'roll"]
ZH = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
      "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面"
      "公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部"
      "正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并"
      "内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原"
      "车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干"
      "模型推理服务器缓存注意力专家路由")
ZH_PUNCT = "，。！？、：；「」『』（）《》…—"
JA = ["こんにちは", "ありがとう", "カタカナ", "ひらがな", "東京", "ラーメン", "すし"]
KO = ["안녕하세요", "감사합니다", "한국어", "서울"]
RU = ["Привет", "мир", "сервер", "Москва", "ЁЖИК"]
EL = ["Καλημέρα", "κόσμε", "ΑΒΓΔ", "λόγος"]
AR = ["مرحبا", "بالعالم", "خادم"]
HI = ["नमस्ते", "दुनिया", "हिन्दी"]
TH = ["สวัสดี", "ภาษาไทย"]
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🧑🏿‍💻", "✨", "🔥", "🙂"]
CODE = [
    "def f(x):\n\treturn x * 2\n",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i];\n}\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "#include <vector>\nstd::vector<int> v{1, 2, 3};\n",
    "SELECT id, name FROM users WHERE age >= 18;\n",
    "const x = await fetch(`/v1/models`);\n",
    "\t\tif (ptr == nullptr) return -1;\r\n",
    "{\"key\": [1, 2.5e-3, null, true]}\n",
]


def corpus_line(rng):
    kind = rng.randrange(10)
    if kind == 0:
        return "".join(rng.choice(ZH) for _ in range(rng.randrange(4, 30))) + rng.choice(ZH_PUNCT)
    if kind == 1:
        return rng.choice(CODE)
    if kind == 2:
        return " ".join(rng.choice(EMOJI + EN_WORDS) for _ in range(rng.randrange(2, 8)))
    if kind == 3:
        return " ".join(str(rng.randrange(10 ** rng.randrange(1, 9))) for _ in range(4))
    if kind == 4:
        return " ".join(rng.choice(JA + KO + RU + EL + AR + HI + TH) for _ in range(5))
    if kind == 5:
        return " " * rng.randrange(1, 40) + rng.choice(EN_WORDS) + "\n" * rng.randrange(1, 4)
    words = [rng.choice(EN_CAPS)] + [rng.choice(EN_WORDS + CONTRACTIONS)
                                     for _ in range(rng.randrange(3, 15))]
    return " ".join(words) + rng.choice([".", "!", "?", ",", ";", ":", " --", "..."])


def make_corpus():
    rng = random.Random(20240601)
    return [corpus_line(rng) for _ in range(6000)]


# Code points drawn for random strings: blocks whose general categories and scripts are the
# same in the Unicode versions of PCRE2 10.42 (14.0), Oniguruma and Rust's regex crate.
CHAR_POOL = (
    [chr(c) for c in range(0x20, 0x7F)] + list("\t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2009"
                                                 "\u200a\u2028\u2029\u202f\u205f\u3000\u180e\u200b")
    + [chr(c) for c in range(0xC0, 0x250, 7)] + [chr(c) for c in range(0x300, 0x370, 5)]
    + [chr(c) for c in range(0x391, 0x3CA, 3)] + [chr(c) for c in range(0x410, 0x450, 3)]
    + [chr(c) for c in range(0x627, 0x64A, 2)] + [chr(c) for c in range(0x905, 0x94D, 2)]
    + [chr(c) for c in range(0xE01, 0xE3A, 3)] + [chr(c) for c in range(0x3041, 0x3096, 4)]
    + [chr(c) for c in range(0x30A1, 0x30FB, 4)] + [chr(c) for c in range(0xAC00, 0xD7A3, 911)]
    + list(ZH[:80] + ZH_PUNCT + "、。〃々〆〇〡〢ー・ｦｱﾞ０１ＡＢａｂ！＃")
    + [chr(c) for c in range(0x1F600, 0x1F650, 5)] + ["\u200d", "\ufe0f", "\U0001F3FD"]
    + ["\U00010000", "\U0001D400", "\U0001D7CE", "\U00020000", "\U0002A700", "\U00030000",
       "\U00040000", "\U000E0001", "\U000E0100", "\U000F0000", "\U0010FFFD", "\u2160", "\u00bd",
       "\u0660", "\u00b2", "\u01c5", "\u02b0", "\u017f", "\u212a", "\x00", "\x7f", "\ufffd"]
)


def edge_strings():
    s = [
        "", " ", "  ", "\t", "\n", "\r\n", "\r\n\r\n", "\n\n\n", " " * 100, "\t" * 7,
        " \n \n", "  \r\n  x", "a" * 300, "1234567", "12345678901234567890", "3.14159",
        "-42 +7 1e10 0x1F", "I'm they'll we've she'd he's it'S YOU'RE", "don't can't won't",
        "'s 's 'll", "Hello, world!", "hello world", "  leading", "trailing  ", "x  \n  y",
        "Mixed CASE words: McDonald's iPhone NASA's", "ǅungla ǲ", "ſtraße 'ſ",
        "👨‍👩‍👧‍👦 family 👍🏽👍🏿 🏳️‍🌈 🧑🏿‍💻", "❤️❤️❤️", "🇯🇵🇺🇸",
        "你好，世界！这是一个测试。", "「引号」、『书名』：《标题》……", "中文English混合123测试",
        "日本語のテキスト、カタカナ。", "한국어 텍스트입니다.", "Привет, мир! ЁЖИК",
        "Καλημέρα κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีครับ",
        "e\u0301 cafe\u0301 \u0301\u0301 n\u0303", "\U00010000\U0001D400\U00020000\U0002A700"
        "\U00030000\U00040000\U000E0001\U000E0100\U000F0000\U0010FFFD",
        "\x00\x01\x1f\x7f", "\u00a0\u2000\u3000 \u1680\u180e\u200b\u2028\u2029\x85",
        "def f(x):\n\treturn x * 2\n", "\tif (a) {\n\t\tb();\n\t}\n",
        "if x:\n    pass\n\n\n    # comment\n", "a\r\nb\rc\nd", "...!!!???", "$$$ %%% &&&",
        "email@example.com https://example.com/path?q=1&r=2", "C++ & C# / F#",
        "<|im_end|>", "<|im_user|>user<|im_middle|>Hi there<|im_end|><|im_assistant|>",
        "[BOS]text[EOS]", "<think>reasoning</think>answer", "<|im_end", "im_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": \"北京\"}<|tool_call_end|>"
        "<|tool_calls_section_end|>",
        "<|reserved_token_1000|>", "<|reserved_token_3005|>", "<|im_end|><|im_end|>", " <|im_end|> ",
        "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜>",
        "<｜end▁of▁sentence｜>", "x<think>y</think>z",
    ]
    return s


def make_cases():
    rng = random.Random(7)
    strings = edge_strings()
    while len(strings) < 140:
        strings.append(" ".join(corpus_line(rng) for _ in range(rng.randrange(1, 4))))
    while len(strings) < 210:
        n = rng.randrange(1, 48)
        strings.append("".join(rng.choice(CHAR_POOL) for _ in range(n)))
    return strings


def train_bpe(corpus, pre_tokenizer, vocab_size, special_tokens):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special_tokens)
    tok.train_from_iterator(corpus, trainer)
    return tok


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def random_id_lists(rng, vocab_size, special_ids):
    out = []
    for i in range(40):
        n = rng.randrange(1, 14)
        ids = [rng.randrange(vocab_size) for _ in range(n)]
        if i % 3 == 0:
            ids[rng.randrange(n)] = rng.choice(special_ids)
        out.append(ids)
    return out


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n")


def kimi_pieces(strings):
    pattern = regex.compile(KIMI_PAT, flags=regex.V1)
    pieces = [pattern.findall(s) for s in strings]
    probe_ranks = {bytes([b]): b for b in range(256)}
    for piece in (p.encode() for ps in pieces for p in ps):
        probe_ranks.setdefault(piece, len(probe_ranks))
    probe = tiktoken.Encoding(name="probe", pat_str=KIMI_PAT, mergeable_ranks=probe_ranks,
                              special_tokens={})
    for s, ps in zip(strings, pieces):
        if probe.encode_ordinary(s) != [probe_ranks[p.encode()] for p in ps]:
            raise SystemExit(f"regex and tiktoken split {s!r} differently")
    return pieces


def make_kimi(corpus, strings):
    split = pre_tokenizers.Split(Regex(KIMI_PAT), behavior="isolated", invert=False)
    tok = train_bpe(corpus, pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 3000, [])
    model = json.loads(tok.to_str())["model"]
    dec = byte_decoder()
    to_bytes = lambda s: bytes(dec[c] for c in s)
    ranks = {bytes([b]): b for b in range(256)}
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = to_bytes(left) + to_bytes(right)
        if token not in ranks:
            ranks[token] = len(ranks)
    lines = [f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()]
    (OUT / "kimi").mkdir(parents=True, exist_ok=True)
    (OUT / "kimi" / "tiktoken.model").write_text("".join(lines))

    num_base = len(ranks)
    specials = {KIMI_NAMED.get(i, f"<|reserved_token_{num_base + i}|>"): num_base + i
                for i in range(NUM_KIMI_SPECIAL)}
    enc = tiktoken.Encoding(name="kimi_fixture", pat_str=KIMI_PAT, mergeable_ranks=ranks,
                            special_tokens=specials)
    skipped = {i for name, i in specials.items() if name not in KIMI_NOT_SKIPPED}
    rng = random.Random(11)
    decode = []
    for ids in random_id_lists(rng, num_base + NUM_KIMI_SPECIAL, sorted(specials.values())):
        for skip in (False, True):
            kept = [i for i in ids if not (skip and i in skipped)]
            decode.append({"ids": ids, "skip_special": skip, "text": enc.decode(kept)})
    write_json(OUT / "kimi" / "expected.json", {
        "vocab_size": num_base + NUM_KIMI_SPECIAL,
        "special": specials,
        "encode_special": [enc.encode(s, allowed_special="all") for s in strings],
        "encode_plain": [enc.encode(s, disallowed_special=()) for s in strings],
        "pieces": kimi_pieces(strings),
        "decode": decode,
    })


def expected_hf(tok, strings, seed):
    def encode(s, plain):
        tok.encode_special_tokens = plain
        return tok.encode(s, add_special_tokens=False).ids

    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    dec = byte_decoder()
    rng = random.Random(seed)
    decode = []
    for ids in random_id_lists(rng, tok.get_vocab_size(), sorted(specials.values())):
        for skip in (False, True):
            decode.append({"ids": ids, "skip_special": skip,
                           "text": tok.decode(ids, skip_special_tokens=skip)})
    out = {
        "vocab_size": tok.get_vocab_size(),
        "special": specials,
        "encode_special": [encode(s, False) for s in strings],
        "encode_plain": [encode(s, True) for s in strings],
        "pieces": [[bytes(dec[c] for c in piece).decode() for piece, _ in
                    tok.pre_tokenizer.pre_tokenize_str(s)] for s in strings],
        "decode": decode,
    }
    tok.encode_special_tokens = False
    return out


def make_deepseek(corpus, strings):
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
              for p in DEEPSEEK_PATS]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok = train_bpe(corpus, pre_tokenizers.Sequence(splits + [byte_level]), 3000,
                    DEEPSEEK_SPECIAL)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in DEEPSEEK_ADDED])
    (OUT / "deepseek").mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "deepseek" / "tokenizer.json"))
    write_json(OUT / "deepseek" / "expected.json", expected_hf(tok, strings, 12))

    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    (OUT / "gpt2").mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "gpt2" / "tokenizer.json"))
    write_json(OUT / "gpt2" / "expected.json", expected_hf(tok, strings, 13))


def main():
    corpus = make_corpus()
    strings = make_cases()
    write_json(OUT / "cases.json", {"strings": strings})
    make_kimi(corpus, strings)
    make_deepseek(corpus, strings)


if __name__ == "__main__":
    main()
