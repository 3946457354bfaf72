#!/usr/bin/env python3
"""PyTorch's grouped MoE experts on the shapes of bench/moe_bench.cu, as JSON lines.

The routed experts of one layer as a PyTorch user runs them: slots sorted by expert
(torch.sort), the token rows gathered in that order, torch._grouped_mm for gate/up
(one [hidden, 2 * inter] matrix per expert), silu(gate) * up, torch._grouped_mm for down,
and the weighted rows summed back per token (index_add_). Weights are bf16: for K3's MXFP4
and DeepSeek-V3.2's FP8 experts this is the "dequantize, then grouped mm" route with the
dequantization done once ahead (not timed), so the figures are an upper bound of that route.
The shapes and the routing (top-k distinct uniformly random experts per token, 8 draws
cycled) are hyserve_moe_bench's; FLOPs are counted as there (2 x 3 x hidden x inter per
slot) and reported as a ratio to a bf16 8192^3 torch.matmul measured in the same run.

Times: median of --iters CUDA-event runs after 3 warm-ups, L2 flushed before each (a 256
MiB memset), as the C++ benchmark does. Needs a CUDA torch with torch._grouped_mm
(PyTorch >= 2.8 on Hopper); not a test.
"""

import argparse
import json
import statistics

import torch

SHAPES = {
    # name: (experts, top_k, hidden, inter)
    "k3": (896, 16, 3584, 3072),
    "deepseek-v32": (256, 8, 7168, 2048),
    "kimi-linear": (256, 8, 2304, 1024),
}


def timed(fn, iters):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for i in range(iters + 3):
        flush.fill_(i & 0xFF)
        e0.record()
        fn(i)
        e1.record()
        torch.cuda.synchronize()
        if i >= 3:
            us.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(us)


def gemm_rate():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = timed(lambda _: torch.matmul(a, b), 20)
    return 2.0 * n**3 / (us * 1e-6)


def routing(tokens, experts, top_k, gen):
    ids = torch.rand(tokens, experts, device="cuda", generator=gen).argsort(dim=1)[:, :top_k]
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen) * 0.25 + 0.05
    return ids.to(torch.int32), weights


def moe(x, ids, weights, w13, w2, inter):
    tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    order = torch.sort(flat, stable=False).indices
    counts = torch.bincount(flat, minlength=w13.shape[0])
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = x[order // top_k]
    gu = torch._grouped_mm(rows, w13, offs=offs)
    h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    out = torch._grouped_mm(h, w2, offs=offs)
    out = out.float() * weights.reshape(-1)[order].unsqueeze(1)
    y = torch.zeros(tokens, x.shape[1], device="cuda", dtype=torch.float32)
    y.index_add_(0, order // top_k, out)
    return y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="k3,deepseek-v32,kimi-linear")
    ap.add_argument("--batches", default="1,8,64,256,4096,16384")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    if not hasattr(torch, "_grouped_mm"):
        raise SystemExit("bench_moe_torch: this torch has no torch._grouped_mm")
    rate = gemm_rate()
    print(json.dumps({"bench": "moe_torch", "torch": torch.__version__,
                      "bf16_matmul_tflops": rate / 1e12}), flush=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    for name in args.shapes.split(","):
        experts, top_k, hidden, inter = SHAPES[name]
        # [E, K, N] as torch._grouped_mm takes them (column-major per expert: the transposes
        # of row-major [N, K] weights, as a checkpoint stores them).
        w13 = torch.randn(experts, 2 * inter, hidden, device="cuda",
                          dtype=torch.bfloat16).mul_(hidden**-0.5).transpose(1, 2)
        w2 = torch.randn(experts, hidden, inter, device="cuda",
                         dtype=torch.bfloat16).mul_(inter**-0.5).transpose(1, 2)
        for batch in (int(b) for b in args.batches.split(",")):
            draws = [routing(batch, experts, top_k, gen) for _ in range(8)]
            x = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16)
            iters = args.iters if batch <= 256 else max(3, args.iters // 2)
            us = timed(lambda i: moe(x, *draws[i % 8], w13, w2, inter), iters)
            flops = 6.0 * batch * top_k * hidden * inter
            print(json.dumps({"bench": "moe_torch", "shape": name, "batch": batch, "us": us,
                              "tflops": flops / (us * 1e-6) / 1e12,
                              "bf16_gemm_ratio": flops / (us * 1e-6) / rate}), flush=True)
        del w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
