"""PyTorch's DSA indexer logits on the shapes of hyserve_indexer_bench (issue 47): the peer it is read beside.

The same math with PyTorch's FP8 GEMM: q quantized to e4m3 per (query, head) row with a power-of-two
scale, the keys' e4m3 codes with theirs; logits[t, h, s] = torch._scaled_mm(q8, k8^T) (cuBLASLt FP8,
fp32 out, or bf16 where this PyTorch refuses fp32), then relu, times the head weights and q scales, summed
over the heads, times the key scales, the causal mask applied. Keys in chunks of --key-chunk (fewer
where the [T * Hi, chunk] fp32 logits would pass 2 GiB). FLOPs counted as the bench counts them (the causal pairs only,
although the GEMM computes every pair). One JSON line per point: median microseconds of CUDA events
over --iters runs after 2 warm-ups.
Usage: python3 tools/bench_indexer_torch.py [--heads 32,64] [--queries 256] [--context 131072,1048576]
"""

import argparse
import json

import torch

DIM = 128
E4M3_MAX = 448.0


def pow2_scale(amax):
    return torch.exp2(torch.ceil(torch.log2(torch.clamp(amax, min=1e-4) / E4M3_MAX)))


def scores(q8, q_scale, w, k8, k_scale, pos, heads, key_chunk, out_dtype):
    t = pos.shape[0]
    s_total = k8.shape[0]
    out = torch.empty(t, s_total, device="cuda", dtype=torch.float32)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    wq = (w * q_scale).view(t, heads, 1)
    for s0 in range(0, s_total, key_chunk):
        kc = k8[s0:s0 + key_chunk]
        logits = torch._scaled_mm(q8, kc.t(), scale_a=one, scale_b=one, out_dtype=out_dtype)
        part = (torch.relu(logits.float()).view(t, heads, -1) * wq).sum(dim=1)
        part *= k_scale[s0:s0 + key_chunk][None, :]
        keys = torch.arange(s0, s0 + kc.shape[0], device="cuda")
        part.masked_fill_(keys[None, :] > pos[:, None], float("-inf"))
        out[:, s0:s0 + kc.shape[0]] = part
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="32,64")
    ap.add_argument("--queries", default="256")
    ap.add_argument("--context", default="131072,1048576")
    ap.add_argument("--key-chunk", type=int, default=65536)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for context in (int(x) for x in args.context.split(",")):
        k = torch.randn(context, DIM, device="cuda", generator=gen)
        k_scale = pow2_scale(k.abs().amax(dim=1))
        k8 = (k / k_scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        del k
        for heads in (int(h) for h in args.heads.split(",")):
            for t in (int(x) for x in args.queries.split(",")):
                if t > context:
                    continue
                q = torch.randn(t * heads, DIM, device="cuda", generator=gen)
                q_scale = pow2_scale(q.abs().amax(dim=1))
                q8 = (q / q_scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
                w = torch.randn(t * heads, device="cuda", generator=gen)
                pos = torch.arange(context - t, context, device="cuda")
                out_dtype = torch.float32
                try:
                    scores(q8, q_scale, w, k8[:256], k_scale[:256], pos.clamp(max=255), heads,
                           args.key_chunk, out_dtype)
                except RuntimeError:
                    out_dtype = torch.bfloat16
                # At most 2 GiB of fp32 logits per chunk of keys.
                chunk = max(256, min(args.key_chunk, (1 << 31) // (t * heads * 4)) // 256 * 256)
                run = lambda: scores(q8, q_scale, w, k8, k_scale, pos, heads, chunk, out_dtype)
                for _ in range(2):
                    run()
                times = []
                for _ in range(args.iters):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    run()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) * 1e3)
                times.sort()
                us = times[len(times) // 2]
                pairs = t * (context - t) + t * (t + 1) / 2
                flop = 2 * heads * DIM * pairs
                print(json.dumps({"bench": "indexer_logits", "impl": "torch_scaled_mm", "heads": heads,
                                  "queries": t, "context": context, "logits": str(out_dtype),
                                  "us": us, "tflops": flop / (us * 1e-6) / 1e12}), flush=True)
                del q, q8, w
                torch.cuda.empty_cache()
        del k8, k_scale


if __name__ == "__main__":
    main()
