#!/usr/bin/env python3
"""PyTorch's version of one DSA decode step, the peer of bench/dsa_decode.cpp.

Same shapes and the same FP8 cache contents' format (not the same bytes): per request a
contiguous FP8 index-key cache [ctx, 128] with fp32 scales and an FP8 latent [ctx, 576].
The step as a PyTorch user writes it:
  indexer   bf16 matmul of the dequantized keys with the query heads, relu, head weights,
            key scales, causal mask                                  -> scores [B, n_q, ctx]
  top-k     torch.topk(scores, 2048)
  sparse    gather the selected FP8 latent rows, dequantize, einsum attention (+ logsumexp)
Requests are processed in groups small enough for the intermediates to fit.
Prints one JSON line per (batch, context) with the keys of hyserve_dsa_decode_bench.
"""
import argparse
import json
import math

import torch


def median_us(fn, iters, flush):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(iters + 3):
        if flush is not None:
            flush.fill_(i & 0xFF)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth():
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = median_us(lambda: b.copy_(a), 20, None)
    return 2.0 * n / (us * 1e-6)


def run_case(batch, ctx, args, copy_bw, flush):
    n_q, hi, heads, topk = args.n_q, args.index_heads, args.heads, args.topk
    row = dict(bench="dsa_decode", impl="torch", batch=batch, context=ctx, n_q=n_q, heads=heads,
               index_heads=hi, topk=topk)
    need = batch * ctx * (576 + 132)
    free, _ = torch.cuda.mem_get_info()
    if need + (8 << 30) > free:
        row["skipped"] = f"needs {need / 1e9:.1f} GB + 8 GB of intermediates, {free / 1e9:.1f} GB free"
        print(json.dumps(row), flush=True)
        return
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(5)

    def codes(shape):  # finite e4m3 codes (bit 3 clear: never S.1111.111)
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=dev, generator=g).bitwise_and_(0xF7)

    def fp8(shape):
        return codes(shape).view(torch.float8_e4m3fn)

    keys = fp8((batch, ctx, 128))
    key_scales = torch.full((batch, ctx), 2.0 ** -8, device=dev)
    latent = codes((batch, ctx, 576))  # gathered as bytes, then viewed as e4m3
    latent_scale = 1.0 / 64
    q8 = fp8((batch, n_q * hi, 128))
    weights = (torch.rand(batch, n_q, hi, device=dev, generator=g) * 2 - 1) * 1e-3
    q = torch.rand(batch, n_q, heads, 576, device=dev, generator=g) * 2 - 1
    scale = 1.0 / math.sqrt(192.0)
    pos = torch.arange(ctx, device=dev)
    qpos = ctx - n_q + torch.arange(n_q, device=dev)
    mask = pos[None, :] > qpos[:, None]  # [n_q, ctx]
    # Requests per group: keep the [group, n_q * hi, ctx] bf16 head scores under ~2 GB.
    group = max(1, min(batch, (1 << 30) // (n_q * hi * ctx)))

    def indexer():
        out = torch.empty(batch, n_q, ctx, device=dev)
        for b0 in range(0, batch, group):
            b1 = min(batch, b0 + group)
            k = keys[b0:b1].to(torch.bfloat16)
            s = torch.matmul(q8[b0:b1].to(torch.bfloat16), k.transpose(1, 2)).relu_()
            s = s.view(b1 - b0, n_q, hi, ctx).float()
            s = (s * weights[b0:b1, :, :, None]).sum(2) * key_scales[b0:b1, None, :]
            out[b0:b1] = s.masked_fill_(mask, float("-inf"))
        return out

    scores = indexer()
    k_eff = min(topk, ctx)

    def select():
        return torch.topk(scores, k_eff, dim=-1).indices

    idx = select()

    def sparse(idx):
        bidx = torch.arange(batch, device=dev)[:, None, None]
        kv = latent[bidx, idx].view(torch.float8_e4m3fn).float() * latent_scale  # [B, n_q, k, 576]
        logits = torch.einsum("bqhd,bqkd->bqhk", q, kv) * scale
        lse = torch.logsumexp(logits, dim=-1)
        p = torch.exp(logits - lse[..., None])
        o = torch.einsum("bqhk,bqkd->bqhd", p, kv[..., :512])
        return o, lse

    def step():
        s = indexer()
        return sparse(torch.topk(s, k_eff, dim=-1).indices)

    t_indexer = median_us(indexer, args.iters, flush)
    t_topk = median_us(select, args.iters, flush)
    t_sparse = median_us(lambda: sparse(idx), args.iters, flush)
    t_step = median_us(step, args.iters, flush)
    rows = batch * n_q
    q_bytes = rows * heads * 576 * 4
    indexer_bytes = batch * ctx * 132 + rows * hi * 132
    sparse_bytes = rows * k_eff * 576 + q_bytes
    for name, us, nbytes in (("indexer", t_indexer, indexer_bytes),
                             ("topk", t_topk, rows * ctx * 4),
                             ("sparse_mla", t_sparse, sparse_bytes),
                             ("step", t_step, indexer_bytes + sparse_bytes)):
        row[f"{name}_us"] = us
        row[f"{name}_bytes"] = nbytes
        row[f"{name}_gb_per_s"] = nbytes / (us * 1e-6) / 1e9
        row[f"{name}_frac_copy_bw"] = nbytes / (us * 1e-6) / copy_bw
    row["copy_gb_per_s"] = copy_bw / 1e9
    print(json.dumps(row), flush=True)
    del keys, latent, scores, idx
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8,32,64")
    ap.add_argument("--context", default="8192,32768,131072,524288,1048576")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--n-q", dest="n_q", type=int, default=1)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--index-heads", dest="index_heads", type=int, default=32)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--block-size", dest="block_size", type=int, default=64)  # accepted, unused
    ap.add_argument("--no-flush", dest="no_flush", action="store_true")
    args = ap.parse_args()
    copy_bw = copy_bandwidth()
    print(json.dumps(dict(bench="peaks", impl="torch", copy_gb_per_s=copy_bw / 1e9,
                          gpu=torch.cuda.get_device_name(), torch=torch.__version__)), flush=True)
    flush = None if args.no_flush else torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for ctx in (int(c) for c in args.context.split(",")):
        for batch in (int(b) for b in args.batch.split(",")):
            try:
                run_case(batch, ctx, args, copy_bw, flush)
            except torch.cuda.OutOfMemoryError as e:
                print(json.dumps(dict(bench="dsa_decode", impl="torch", batch=batch, context=ctx,
                                      skipped=f"out of memory: {str(e).splitlines()[0]}")), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
