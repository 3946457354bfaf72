#!/usr/bin/env python3
"""flash-linear-attention's KDA kernels on the shapes of bench/kda_bench.cpp, as JSON lines.

Decode: fused_recurrent_kda_fwd (the path vLLM serves KDA decode with) for --batches
requests of --tokens-per-row tokens each (cu_seqlens when more than one), q/k/v in bf16,
the fp32 states updated in place, the q/k l2norm, the gate (bounded form, K3's) and the
beta sigmoid in the kernel. Bytes: each [K, V] fp32 state read and written once plus the
per-token inputs, as hyserve_kda_bench counts them (it also runs the short convs and the
gated output norm, which fla leaves to other kernels).
Prefill: chunk_kda on --lengths tokens, one sequence or 8 of the same unequal lengths as
hyserve_kda_bench (cu_seqlens), q/k/v bf16, g fp32 log-decays, q/k l2norm in the kernel.

Times: median of --iters CUDA-event runs after 3 warm-ups, L2 flushed before each (a 256
MiB memset), as the C++ benchmark does; the copy bandwidth is measured in the same run.
Needs torch, triton and the flash-linear-attention wheel (fla-core); not a test.
"""

import argparse
import json
import statistics

import torch

D = 128


def timed(fn, iters):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for i in range(iters + 3):
        flush.fill_(i & 0xFF)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        if i >= 3:
            us.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(us)


def copy_bandwidth():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = timed(lambda: b.copy_(a), 20)
    return 2.0 * n / (us * 1e-6)


def lengths_of(total, seqs):
    """The unequal lengths of hyserve_kda_bench: weights 1..seqs, chunks of 64."""
    weight_sum = seqs * (seqs + 1) // 2
    out, used = [], 0
    for s in range(seqs):
        n = total - used if s + 1 == seqs else total * (s + 1) // weight_sum // 64 * 64
        out.append(n)
        used += n
    return out


def bench_decode(heads, batch, per_row, iters, copy_bw):
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    t = batch * per_row
    dev = "cuda"
    q = torch.randn(1, t, heads, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, t, heads, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, t, heads, D, device=dev, dtype=torch.bfloat16)
    g = torch.randn(1, t, heads, D, device=dev, dtype=torch.bfloat16)
    beta = torch.randn(1, t, heads, device=dev, dtype=torch.bfloat16)
    a_log = torch.randn(heads, device=dev, dtype=torch.float32) * 0.5
    dt_bias = torch.randn(heads * D, device=dev, dtype=torch.float32) * 0.5
    state = torch.randn(batch, heads, D, D, device=dev, dtype=torch.float32) * 0.1
    cu = torch.arange(0, t + 1, per_row, device=dev, dtype=torch.long)

    def run():
        fused_recurrent_kda_fwd(
            q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias, initial_state=state,
            inplace_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)

    line = {"bench": "fla_fused_recurrent_kda", "heads": heads, "head_dim": D, "batch": batch,
            "tokens_per_row": per_row}
    try:
        us = timed(run, iters)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        line["error"] = f"{type(e).__name__}: {e}"[:300]
        print(json.dumps(line), flush=True)
        return
    state_bytes = 2.0 * batch * heads * D * D * 4
    nbytes = state_bytes + t * heads * (4 * D * 2 + 2)
    gbps = nbytes / (us * 1e-6) / 1e9
    line.update({"us": us, "bytes": nbytes, "state_bytes": state_bytes, "gbps": gbps,
                 "copy_ratio": gbps * 1e9 / copy_bw})
    print(json.dumps(line), flush=True)


def bench_prefill(heads, total, seqs, iters):
    from fla.ops.kda.chunk import chunk_kda

    dev = "cuda"
    lens = lengths_of(total, seqs)
    q = torch.randn(1, total, heads, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, total, heads, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, total, heads, D, device=dev, dtype=torch.bfloat16)
    g = -torch.rand(1, total, heads, D, device=dev, dtype=torch.float32) * 2
    beta = torch.rand(1, total, heads, device=dev, dtype=torch.bfloat16)
    h0 = torch.randn(seqs, heads, D, D, device=dev, dtype=torch.float32) * 0.1
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device=dev,
                      dtype=torch.long)

    def run():
        chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu if seqs > 1 else None)

    line = {"bench": "fla_chunk_kda", "heads": heads, "head_dim": D, "tokens": total,
            "seqs": seqs, "lengths": ",".join(map(str, lens))}
    try:
        with torch.no_grad():
            line["us"] = timed(run, iters)
    except Exception as e:  # noqa: BLE001
        line["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["decode", "prefill", "all"], default="all")
    ap.add_argument("--heads", type=int, nargs="+", default=[96, 12, 32])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--tokens-per-row", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    copy_bw = copy_bandwidth()
    print(json.dumps({"bench": "copy", "gbps": copy_bw / 1e9}), flush=True)
    if a.case != "prefill":
        for h in a.heads:
            for b in a.batches:
                for n in a.tokens_per_row:
                    bench_decode(h, b, n, a.iters, copy_bw)
    if a.case != "decode":
        for h in a.heads:
            for t in a.lengths:
                for s in a.seqs:
                    bench_prefill(h, t, s, max(3, a.iters // 4))


if __name__ == "__main__":
    main()
