"""Encodes the tiny-k3-speaks corpus with its trained tokenizer, once, on the CPU (issue 50).

The GPU machine has no network and no `regex` wheel is needed there: this writes the token ids
that tools/tiny_k3/train.py reads, next to the corpus (git-ignored):

  .cache/tiny-k3-speaks/tokens/train.u16    uint16 little-endian ids, documents concatenated,
  .cache/tiny-k3-speaks/tokens/heldout.u16  each followed by the end-of-document token
  .cache/tiny-k3-speaks/tokens/manifest.json  counts, sha256 of the inputs and outputs

A document is one blank-line-separated block of tools/make_corpus.py's train.txt / heldout.txt
(one paragraph per line); its paragraphs stay joined by "\n" and it ends with <|im_end|> (4098,
the config's eos_token_id), so a generation that reaches the end of a document stops. Encoding is
tools/train_bpe.py's tiktoken-rule Encoder over models/tiny-k3-speaks/tiktoken.model.
Deterministic. Usage: python tools/tiny_k3/tokenize_corpus.py [--corpus DIR] [--out DIR]
"""

import argparse
import base64
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from train_bpe import Encoder  # noqa: E402

END_OF_DOCUMENT = 4098  # <|im_end|>, tokenizer_config.json's eos_token


def load_ranks(path):
    tokens = []
    for line in path.read_text(encoding="ascii").splitlines():
        b64, rank = line.split()
        assert int(rank) == len(tokens)
        tokens.append(base64.b64decode(b64))
    return tokens


def documents(text):
    return [d.strip("\n") for d in text.split("\n\n") if d.strip()]


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / ".cache/tiny-k3-speaks/corpus")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache/tiny-k3-speaks/tokens")
    args = parser.parse_args()
    encoder = Encoder(load_ranks(ROOT / "models/tiny-k3-speaks/tiktoken.model"))
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"end_of_document_id": END_OF_DOCUMENT, "dtype": "uint16 little-endian"}
    for split in ("train", "heldout"):
        start = time.perf_counter()
        src = args.corpus / f"{split}.txt"
        docs = documents(src.read_text(encoding="utf-8"))
        ids = []
        for doc in docs:
            ids += encoder.encode_ordinary(doc)
            ids.append(END_OF_DOCUMENT)
        dst = args.out / f"{split}.u16"
        np.asarray(ids, dtype="<u2").tofile(dst)
        manifest[split] = {"documents": len(docs), "tokens": len(ids), "bytes": src.stat().st_size,
                           "source_sha256": sha256(src),
                           "sha256": sha256(dst)}
        print(f"{split}: {len(docs)} documents -> {len(ids)} tokens ({time.perf_counter() - start:.1f} s)")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
