"""Byte-level BPE in Kimi's tiktoken format, trained on tools/make_corpus.py's corpus (issue 50).

Writes models/tiny-k3-speaks/tiktoken.model + tokenizer_config.json (the tokenizer of the tiny
model that speaks; the weights come later) and tests/fixtures/tiny_k3_speaks_tokenizer/golden.json
(ids from this file's own encoder, checked against hyserve's TiktokenTokenizer by
tests/trained_tokenizer_test.cpp).

Training (standard byte-level BPE over a chunk histogram):
  1. train.txt is cut into chunks by Kimi's split regex (the same pattern as hyserve's
     kKimiSplitPattern: tokenization_kimi.py's `&&[^\\p{Han}]` written as lookaheads); each distinct
     chunk's UTF-8 bytes are counted once.
  2. Ranks 0..255 are the single bytes. Then, until --num-ranks: the adjacent pair with the largest
     count over the histogram (ties: the smaller (left id, right id)) becomes the next rank, its
     bytes the concatenation; only the chunks holding the pair are rewritten (pair -> chunks index,
     a max-heap with stale entries skipped). A pair whose bytes already are a token (two merge
     paths to the same bytes) is merged into that token without a new rank.
  3. The special tokens take ids N .. N + 255 in Kimi's reserved layout ([BOS] N, [EOS] N+1,
     <|im_end|> N+2, ..., <think> N+22, </think> N+23, [UNK] N+254, [PAD] N+255), named in
     tokenizer_config.json's added_tokens_decoder; bos/eos tokens, model_max_length and the chat
     template are models/tiny-kimi-k3's, byte for byte (the model-facing format is K3's).

Encoding (tiktoken's rule, used for the goldens and the held-out measure): each chunk that is a
token is that token; otherwise, from its bytes, repeatedly merge the adjacent pair whose
concatenation has the lowest rank (leftmost on ties) until no adjacent pair is a token.

Deterministic given the corpus. Needs the `regex` package (tools/requirements-tokenizer.txt).
Usage: python3 tools/train_bpe.py [--corpus DIR] [--num-ranks 4096]
"""

import argparse
import base64
import collections
import heapq
import json
import time
from pathlib import Path

import regex

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "models" / "tiny-k3-speaks"
GOLDEN_DIR = ROOT / "tests" / "fixtures" / "tiny_k3_speaks_tokenizer"
TEMPLATE_SOURCE = ROOT / "models" / "tiny-kimi-k3" / "tokenizer_config.json"

KIMI_SPLIT = regex.compile("|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*"
    r"(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+"
    r"(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
]))

NUM_RESERVED_SPECIAL = 256
# Kimi's reserved special tokens: (offset from N, content, special). <think> / </think> are not
# "special" (decode with skip_special keeps them, so reasoning parsers see them).
KIMI_SPECIAL_TOKENS = [
    (0, "[BOS]", True), (1, "[EOS]", True), (2, "<|im_end|>", True), (3, "<|im_user|>", True),
    (4, "<|im_assistant|>", True), (6, "<|start_header_id|>", True),
    (7, "<|end_header_id|>", True), (9, "[EOT]", True), (10, "<|im_system|>", True),
    (11, "<|tool_calls_section_begin|>", True), (12, "<|tool_calls_section_end|>", True),
    (13, "<|tool_call_begin|>", True), (14, "<|tool_call_argument_begin|>", True),
    (15, "<|tool_call_end|>", True), (17, "<|im_middle|>", True), (18, "<|media_begin|>", True),
    (19, "<|media_content|>", True), (20, "<|media_end|>", True), (21, "<|media_pad|>", True),
    (22, "<think>", False), (23, "</think>", False), (254, "[UNK]", True), (255, "[PAD]", True),
]

GOLDEN_SENTENCE = ("The quick brown fox doesn't read Python's documentation; it reads "
                   "  3.14159 bytes\tand\n\nsays \"héllo, 世界\" to <|im_end|> 123456789!")
NUM_GOLDEN_PARAGRAPHS = 5


def chunk_histogram(text):
    counts = collections.Counter(KIMI_SPLIT.findall(text))
    return {chunk.encode("utf-8"): n for chunk, n in counts.items()}


def train(histogram, num_ranks):
    """The token bytes by rank (ranks 0..255 the single bytes, then merges in order)."""
    tokens = [bytes([b]) for b in range(256)]
    rank_of = {t: r for r, t in enumerate(tokens)}
    words = [list(chunk) for chunk in histogram]
    freqs = list(histogram.values())
    pair_counts = collections.Counter()
    pair_words = collections.defaultdict(set)
    for w, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freq
            pair_words[pair].add(w)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    while len(tokens) < num_ranks and heap:
        negative_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative_count or negative_count == 0:
            continue  # a stale entry: the pair's count changed since it was pushed
        merged = tokens[pair[0]] + tokens[pair[1]]
        new_id = rank_of.get(merged)
        if new_id is None:
            new_id = len(tokens)
            tokens.append(merged)
            rank_of[merged] = new_id
        changed = set()
        for w in sorted(pair_words.pop(pair)):
            word, freq = words[w], freqs[w]
            merged_word = []
            k = 0
            while k < len(word):
                if k + 1 < len(word) and (word[k], word[k + 1]) == pair:
                    merged_word.append(new_id)
                    k += 2
                else:
                    merged_word.append(word[k])
                    k += 1
            if len(merged_word) == len(word):
                continue
            for old in zip(word, word[1:]):
                pair_counts[old] -= freq
                changed.add(old)
            for new in zip(merged_word, merged_word[1:]):
                pair_counts[new] += freq
                pair_words[new].add(w)
                changed.add(new)
            words[w] = merged_word
        for p in changed:
            count = pair_counts[p]
            if count <= 0:
                del pair_counts[p]
            elif p != pair:
                heapq.heappush(heap, (-count, p))
        pair_counts.pop(pair, None)
    return tokens


class Encoder:
    """tiktoken's encoding rule over the trained ranks, with a cache per chunk."""

    def __init__(self, tokens):
        self.ranks = {t: r for r, t in enumerate(tokens)}
        self.cache = {}

    def encode_chunk(self, chunk):
        if chunk in self.ranks:
            return [self.ranks[chunk]]
        if chunk in self.cache:
            return self.cache[chunk]
        parts = [bytes([b]) for b in chunk]
        while len(parts) > 1:
            best = None
            for k in range(len(parts) - 1):
                rank = self.ranks.get(parts[k] + parts[k + 1])
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, k)
            if best is None:
                break
            k = best[1]
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        ids = [self.ranks[p] for p in parts]
        self.cache[chunk] = ids
        return ids

    def encode_ordinary(self, text):
        ids = []
        for chunk in KIMI_SPLIT.findall(text):
            ids += self.encode_chunk(chunk.encode("utf-8"))
        return ids

    def encode(self, text, specials):
        """Special-token strings become their ids (leftmost, then longest), as hyserve's
        encode(text, allow_special=true)."""
        pattern = regex.compile("|".join(regex.escape(s) for s in
                                         sorted(specials, key=len, reverse=True)))
        ids, pos = [], 0
        for match in pattern.finditer(text):
            ids += self.encode_ordinary(text[pos:match.start()])
            ids.append(specials[match.group(0)])
            pos = match.end()
        return ids + self.encode_ordinary(text[pos:])


def write_tokenizer(tokens):
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    with open(MODEL_DIR / "tiktoken.model", "w", encoding="ascii", newline="\n") as f:
        for rank, token in enumerate(tokens):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")
    n = len(tokens)
    bundled = json.loads(TEMPLATE_SOURCE.read_text(encoding="utf-8"))
    config = {
        "added_tokens_decoder": {
            str(n + offset): {"content": content, "special": special}
            for offset, content, special in KIMI_SPECIAL_TOKENS
        },
    }
    for key in ("bos_token", "eos_token", "model_max_length", "chat_template"):
        config[key] = bundled[key]
    (MODEL_DIR / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return {content: n + offset for offset, content, _ in KIMI_SPECIAL_TOKENS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / ".cache/tiny-k3-speaks/corpus")
    parser.add_argument("--num-ranks", type=int, default=4096)
    args = parser.parse_args()
    train_text = (args.corpus / "train.txt").read_text(encoding="utf-8")
    heldout_text = (args.corpus / "heldout.txt").read_text(encoding="utf-8")

    start = time.perf_counter()
    histogram = chunk_histogram(train_text)
    split_s = time.perf_counter() - start
    tokens = train(histogram, args.num_ranks)
    train_s = time.perf_counter() - start
    specials = write_tokenizer(tokens)

    encoder = Encoder(tokens)
    heldout_ids = encoder.encode_ordinary(heldout_text)
    heldout_bytes = len(heldout_text.encode("utf-8"))
    train_bytes = len(train_text.encode("utf-8"))
    # The golden paragraphs: the first NUM_GOLDEN_PARAGRAPHS held-out lines of 300..1000 bytes.
    paragraphs = [line for line in heldout_text.split("\n")
                  if 300 <= len(line.encode("utf-8")) <= 1000][:NUM_GOLDEN_PARAGRAPHS]
    golden = {
        "comment": "written by tools/train_bpe.py; ids from its own tiktoken-rule encoder",
        "num_ranks": len(tokens),
        "corpus_manifest": json.loads((args.corpus / "manifest.json").read_text()),
        "train_bytes": train_bytes,
        "train_distinct_chunks": len(histogram),
        "heldout_bytes": heldout_bytes,
        "heldout_tokens": len(heldout_ids),
        "heldout_tokens_per_byte": round(len(heldout_ids) / heldout_bytes, 4),
        "sentence": GOLDEN_SENTENCE,
        "sentence_ids": encoder.encode(GOLDEN_SENTENCE, specials),
        "heldout_paragraphs": [{"text": p, "ids": encoder.encode_ordinary(p)} for p in paragraphs],
    }
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    (GOLDEN_DIR / "golden.json").write_text(
        json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"train: {train_bytes} bytes, {len(histogram)} distinct chunks (split {split_s:.1f} s); "
          f"{len(tokens)} ranks in {train_s:.1f} s")
    print(f"held-out: {heldout_bytes} bytes -> {len(heldout_ids)} tokens "
          f"({len(heldout_ids) / heldout_bytes:.4f} tokens per byte)")


if __name__ == "__main__":
    main()
