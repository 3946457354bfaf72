"""The DSA decode benchmark's report: our JSON lines and PyTorch's side by side, and the
issue's targets checked against them (by how much each point meets or misses).

    python3 tools/dsa_decode_report.py hyserve.jsonl torch.jsonl [--markdown]

hyserve.jsonl is hyserve_dsa_decode_bench's output, torch.jsonl tools/bench_dsa_torch.py's
(bench/run_dsa_decode.sh writes both). Without --markdown it prints a fixed-width table; with
it, the Markdown table BENCHMARKS.md uses. Targets (issue 6):
  - the whole step at >= 75% of the copy bandwidth at batch >= 8 and context >= 128K;
  - DSA step / dense step <= 0.30 at 128K and <= 0.25 at 1M;
  - the top-k of one 1M row at least 5x faster than torch.topk.
"""

import argparse
import json
import sys

STEP_FRACTION = 0.75
RATIO_TARGETS = {131072: 0.30, 1048576: 0.25}
TOPK_SPEEDUP = 5.0


def load(path):
    rows, peaks = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            if j.get("bench") == "peaks":
                peaks = j
            elif j.get("bench") == "dsa_decode":
                rows[(j["batch"], j["context"])] = j
    return rows, peaks


def context_name(ctx):
    return f"{ctx // 1048576}M" if ctx % 1048576 == 0 else f"{ctx // 1024}K"


def us(v):
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def table_rows(ours, theirs):
    for key in sorted(ours, key=lambda k: (k[1], k[0])):
        o, t = ours[key], theirs.get(key, {})
        if "skipped" in o:
            yield key, None
            continue
        yield key, [
            us(o["indexer_us"]),
            f"{100 * o['indexer_frac_copy_bw']:.0f}%",
            us(o["topk_us"]),
            us(o["sparse_mla_us"]),
            us(o["step_us"]),
            f"{100 * o['step_frac_copy_bw']:.0f}%",
            us(o["dense_us"]),
            f"{o['dsa_over_dense']:.3f}",
            us(t.get("topk_us")),
            us(t.get("step_us")),
            "-" if ratio(t.get("topk_us"), o["topk_us"]) is None
            else f"{ratio(t.get('topk_us'), o['topk_us']):.1f}",
            "-" if ratio(t.get("step_us"), o["step_us"]) is None
            else f"{ratio(t.get('step_us'), o['step_us']):.1f}",
        ]


HEADER = ["indexer", "indexer % copy", "top-k", "sparse MLA", "step", "step % copy", "dense",
          "DSA/dense", "torch top-k", "torch step", "top-k x", "step x"]
SHORT_HEADER = ["indexer", "idx%copy", "topk", "sparse", "step", "step%copy", "dense",
                "dsa/dense", "torch topk", "torch step", "topk x", "step x"]


def print_table(ours, theirs, markdown, out):
    if markdown:
        out.write("| batch | context | " + " | ".join(HEADER) + " |\n")
        out.write("|" + "---|" * (len(HEADER) + 2) + "\n")
        for (b, ctx), cells in table_rows(ours, theirs):
            if cells is None:
                out.write(f"| {b} | {context_name(ctx)} | skipped |\n")
            else:
                out.write(f"| {b} | {context_name(ctx)} | " + " | ".join(cells) + " |\n")
        return
    out.write(("{:>6} {:>8} " + "{:>10} " * len(SHORT_HEADER)).format(
        "batch", "context", *SHORT_HEADER).rstrip() + "\n")
    for (b, ctx), cells in table_rows(ours, theirs):
        if cells is None:
            out.write(f"{b:>6} {context_name(ctx):>8}  skipped\n")
        else:
            out.write(("{:>6} {:>8} " + "{:>10} " * len(cells)).format(
                b, context_name(ctx), *cells).rstrip() + "\n")


def targets(ours, theirs):
    """Lines of (met, text) for every point a target applies to."""
    lines = []
    for (b, ctx), o in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if "skipped" in o or b < 8 or ctx < 131072:
            continue
        frac = o["step_frac_copy_bw"]
        allowed = o["step_us"] * frac / STEP_FRACTION  # the step time at exactly 75%
        rest = o["step_us"] - o["indexer_us"]
        budget = allowed - o["indexer_us"]
        met = frac >= STEP_FRACTION
        verdict = "met" if met else f"{o['step_us'] - allowed:.1f} us over"
        lines.append((met, f"step >= 75% of copy, B={b} x {context_name(ctx)}: "
                           f"{100 * frac:.1f}%, {o['step_us']:.1f} us against {allowed:.1f} "
                           f"allowed ({verdict}); step minus indexer {rest:.1f} us, 75% "
                           f"leaves it {budget:.1f}"))
    for (b, ctx), o in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if "skipped" in o or ctx not in RATIO_TARGETS:
            continue
        want = RATIO_TARGETS[ctx]
        met = o["dsa_over_dense"] <= want
        lines.append((met, f"DSA/dense <= {want:.2f}, B={b} x {context_name(ctx)}: "
                           f"{o['dsa_over_dense']:.3f} ({'met' if met else 'missed'})"))
    one = ours.get((1, 1048576))
    t = theirs.get((1, 1048576), {})
    if one is not None and "skipped" not in one and t.get("topk_us") is not None:
        speedup = t["topk_us"] / one["topk_us"]
        met = speedup >= TOPK_SPEEDUP
        lines.append((met, f"top-k of one 1M row >= 5x torch.topk: {speedup:.2f}x "
                           f"({one['topk_us']:.1f} vs {t['topk_us']:.1f} us; "
                           f"{'met' if met else 'missed'})"))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours")
    ap.add_argument("theirs")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    ours, our_peak = load(args.ours)
    theirs, their_peak = load(args.theirs)
    if our_peak is None:
        sys.exit(f"{args.ours}: no peaks line (not hyserve_dsa_decode_bench output?)")
    their_copy = f"{their_peak['copy_gb_per_s']:.0f} GB/s" if their_peak else "-"
    print(f"GPU {our_peak.get('gpu')}: copy {our_peak['copy_gb_per_s']:.0f} GB/s (hyserve run), "
          f"{their_copy} (torch run). Times in us.")
    print_table(ours, theirs, args.markdown, sys.stdout)
    lines = targets(ours, theirs)
    if lines:
        print(f"\nTargets: {sum(m for m, _ in lines)} of {len(lines)} met")
        for met, text in lines:
            print(("  met     " if met else "  MISSED  ") + text)


if __name__ == "__main__":
    main()
