#!/usr/bin/env bash
# Runs hyserve's DSA decode benchmark and PyTorch's version of the same step on the same
# shapes, one after the other on the same GPU, and prints both side by side.
#   bench/run_dsa_decode.sh [--batch 1,8,32,64] [--context 8192,...,1048576] [--iters 20]
#                           [--n-q 1] [--heads 64] ...          (passed to both)
# BUILD (default build-gpu) is the CMake build directory; OUT (default dsa_decode_out)
# receives hyserve.jsonl, torch.jsonl and table.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-dsa_decode_out}
mkdir -p "$OUT"
"$BUILD/hyserve_dsa_decode_bench" "$@" | tee "$OUT/hyserve.jsonl"
python3 tools/bench_dsa_torch.py "$@" | tee "$OUT/torch.jsonl"
python3 - "$OUT/hyserve.jsonl" "$OUT/torch.jsonl" <<'PY' | tee "$OUT/table.txt"
import json, sys
def load(path):
    rows, peaks = {}, None
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j.get("bench") == "peaks":
            peaks = j
        elif j.get("bench") == "dsa_decode":
            rows[(j["batch"], j["context"])] = j
    return rows, peaks
ours, our_peak = load(sys.argv[1])
torch_rows, torch_peak = load(sys.argv[2])
print(f"GPU {our_peak.get('gpu')}: copy {our_peak['copy_gb_per_s']:.0f} GB/s (hyserve run), "
      f"{torch_peak['copy_gb_per_s']:.0f} GB/s (torch run). Times in us.")
hdr = ("batch", "context", "indexer", "topk", "sparse", "step", "step%copy", "dense", "dsa/dense",
       "| torch:", "indexer", "topk", "sparse", "step", "| topk x", "step x")
print(("{:>6} {:>8} " + "{:>9} " * 14).format(*hdr))
def f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)
for key in sorted(ours, key=lambda k: (k[1], k[0])):
    o, t = ours[key], torch_rows.get(key, {})
    if "skipped" in o:
        print(f"{key[0]:>6} {key[1]:>8}  skipped: {o['skipped']}")
        continue
    tt = lambda k: t.get(k)
    ratio = lambda a, b: None if a is None or b is None else a / b
    print(("{:>6} {:>8} " + "{:>9} " * 14).format(
        key[0], key[1], f(o["indexer_us"]), f(o["topk_us"]), f(o["sparse_mla_us"]),
        f(o["step_us"]), f(100 * o["step_frac_copy_bw"], "{:.0f}%"), f(o["dense_us"]),
        f(o["dsa_over_dense"], "{:.3f}"), "|", f(tt("indexer_us")), f(tt("topk_us")),
        f(tt("sparse_mla_us")), f(tt("step_us")),
        "| " + f(ratio(tt("topk_us"), o["topk_us"]), "{:.1f}"),
        f(ratio(tt("step_us"), o["step_us"]), "{:.1f}")))
PY
