#!/usr/bin/env bash
# Runs hyserve's DSA decode benchmark and PyTorch's version of the same step on the same
# shapes, one after the other on the same GPU, and prints both side by side with the
# issue's targets checked (tools/dsa_decode_report.py; --markdown there gives the table
# BENCHMARKS.md uses).
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
python3 tools/dsa_decode_report.py "$OUT/hyserve.jsonl" "$OUT/torch.jsonl" | tee "$OUT/table.txt"
