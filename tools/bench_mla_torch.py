"""PyTorch's dense MLA prefill on the shapes of hyserve_mla_prefill_bench (issue 47): the peer it is read beside.

The expanded form as vLLM's MLA prefill computes it: k_nope and v per head from the latent
(c @ kv_b^T, bf16), k_pe broadcast to every head, then torch.nn.functional.scaled_dot_product_attention
(causal, bf16; PyTorch picks its fastest backend, v padded to the q/k width where the backend needs
equal widths). Prefix 0 only (SDPA's causal mask is aligned top-left). FLOPs counted as the bench
counts them. One JSON line per point: median microseconds of CUDA events over --iters runs after
3 warm-ups.
Usage: python3 tools/bench_mla_torch.py [--heads 32,128] [--tokens 4096,16384] [--iters 5]
"""

import argparse
import json

import torch
import torch.nn.functional as F

DN, DR, DV, KV_LORA = 128, 64, 128, 512


def attend(q, latent, kv_b, heads):
    t = q.shape[0]
    c, k_pe = latent[:, :KV_LORA], latent[:, KV_LORA:]
    kv = (c @ kv_b.t()).view(t, heads, DN + DV)
    k = torch.cat([kv[:, :, :DN], k_pe[:, None, :].expand(t, heads, DR)], dim=-1)
    v = F.pad(kv[:, :, DN:], (0, DN + DR - DV))
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                       v.transpose(0, 1)[None], is_causal=True)
    return o[0, :, :, :DV].transpose(0, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="32,128")
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for heads in (int(h) for h in args.heads.split(",")):
        for t in (int(x) for x in args.tokens.split(",")):
            q = torch.randn(t, heads, DN + DR, device="cuda", generator=gen, dtype=torch.bfloat16)
            latent = torch.randn(t, KV_LORA + DR, device="cuda", generator=gen, dtype=torch.bfloat16)
            kv_b = torch.randn(heads * (DN + DV), KV_LORA, device="cuda", generator=gen,
                               dtype=torch.bfloat16) * KV_LORA ** -0.5
            for _ in range(3):
                attend(q, latent, kv_b, heads)
            times = []
            for _ in range(args.iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                attend(q, latent, kv_b, heads)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            times.sort()
            us = times[len(times) // 2]
            pairs = t * (t + 1) / 2
            flop = 2 * heads * (DN + DR + DV) * pairs + 2 * t * heads * (DN + DV) * KV_LORA
            print(json.dumps({"bench": "mla_prefill", "impl": "torch_sdpa", "heads": heads, "tokens": t,
                              "prefix": 0, "us": us, "tflops": flop / (us * 1e-6) / 1e12}), flush=True)
            del q, latent, kv_b
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
