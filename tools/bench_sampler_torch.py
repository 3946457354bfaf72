"""PyTorch's sampler on the shapes of hyserve_sampler_bench (issue 51): the peer it is read beside.

Per row: greedy (argmax), or temperature 0.8 with top-k / top-p applied as vLLM's PyTorch fallback
does (sort the logits, mask past the top-k and the top-p prefix, softmax, torch.multinomial).
Logits: "peaked" (normal, sigma 6) and "flat" (sigma 1), vocabulary 163,840. One JSON line per point:
median microseconds of CUDA events over 50 runs after 10 warm-ups.
Usage: python3 tools/bench_sampler_torch.py [--batches 1,2,4,8,64,256] [--vocab 163840]
"""

import argparse
import json

import torch


def sample(logits, temperature, top_k, top_p):
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k or top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        if top_k:
            sorted_logits[:, top_k:] = float("-inf")
        if top_p < 1:
            probs = sorted_logits.softmax(dim=-1)
            cum = probs.cumsum(dim=-1)
            sorted_logits[(cum - probs) > top_p] = float("-inf")
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(dim=-1), 1).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4,8,64,256")
    ap.add_argument("--vocab", type=int, default=163840)
    args = ap.parse_args()
    options = [("greedy", 0, 0, 1.0), ("t0.8", 0.8, 0, 1.0), ("t0.8_p0.95", 0.8, 0, 0.95),
               ("t0.8_k50_p0.95", 0.8, 50, 0.95)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape, sigma in (("peaked", 6.0), ("flat", 1.0)):
        for rows in (int(b) for b in args.batches.split(",")):
            logits = torch.randn(rows, args.vocab, device="cuda", generator=gen) * sigma
            for name, t, k, p in options:
                for _ in range(10):
                    sample(logits, t, k, p)
                times = []
                for _ in range(50):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    sample(logits, t, k, p)
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) * 1e3)
                times.sort()
                print(json.dumps({"bench": "sampler", "impl": "torch", "logits": shape, "options": name,
                                  "batch": rows, "vocab": args.vocab, "us": times[len(times) // 2]}), flush=True)


if __name__ == "__main__":
    main()
