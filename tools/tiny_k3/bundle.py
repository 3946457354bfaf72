"""Installs a trained tiny K3.1 Pro (issue 50) as the bundled model that speaks.

    python tools/tiny_k3/bundle.py --from OUT/tiny-k3-speaks [--models-dir models/tiny-k3-speaks]
                                   [--golden-dir tests/fixtures/tiny_k3_speaks]

OUT/tiny-k3-speaks is what tools/tiny_k3/device_train.sh writes on the GPU machine (config.json,
model.safetensors, the tokenizer files, loss_curve.jsonl, result.json). This script, on the CPU
machine (torch, numpy, safetensors: tools/requirements-train.txt):

1. refuses a folder whose tokenizer files are not byte for byte the bundled tokenizer's (the
   model was trained on those ids), whose weights are 30 MB or more (the bundled size limit), or
   whose training skipped non-finite steps or ended with a non-finite held-out perplexity;
2. copies config.json and model.safetensors into --models-dir;
3. writes the golden logits (golden.safetensors + meta.json) of the installed model into
   --golden-dir with tools/tiny_k3/check_export.py --model ... --write-golden (k3_reference in
   float64 on held-out token windows; that check's agreement figures must pass);
4. writes the README's "Weights" section (between the markers below) from result.json and the
   loss curve: parameters, steps, tokens, training time and device, the held-out perplexity of
   the trained model and of the exported checkpoint (bf16, MXFP4 experts, the indexer's top-k),
   bits per byte, and the loss every tenth of the run.

What it leaves to a person (printed at the end): the golden fixture's row in
tests/golden_util.h, and the measurements issue 50 item 5 asks for in BENCHMARKS.md.
"""

import argparse
import filecmp
import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MAX_BYTES = 30 * 1000 * 1000
BEGIN = "<!-- weights: written by tools/tiny_k3/bundle.py -->"
END = "<!-- end of weights -->"
TOKENIZER_FILES = ("tiktoken.model", "tokenizer_config.json")


def fail(message):
    sys.exit(f"bundle: {message}")


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def read_curve(path):
    steps, evals = [], []
    if not os.path.exists(path):
        return steps, evals
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "step" in row and "loss" in row:
                steps.append(row)
            elif "eval" in row:
                evals.append(row)
    return steps, evals


def weights_section(result, steps, evals, size_bytes):
    args = result.get("args", {})
    tokens_per_step = args.get("batch", 0) * args.get("seq", 0)
    lines = [BEGIN, "", "## Weights", ""]
    lines.append(f"- {result.get('params', 0):,} parameters, {result.get('steps_done', 0):,} steps of "
                 f"{args.get('batch')} x {args.get('seq')} tokens ({result.get('steps_done', 0) * tokens_per_step:,} "
                 f"tokens), {result.get('train_s')} s of training on `{args.get('device')}`"
                 f"{' (stopped by the time limit)' if result.get('stopped_early_by_time_limit') else ''}; "
                 f"seed {result.get('seed')}; `model.safetensors` {size_bytes / 1e6:.1f} MB.")
    ppl = [("trained model (fp32, dense attention)", result.get("heldout_ppl_trained_fp32")),
           ("exported checkpoint (bf16, MXFP4 experts, the indexer's top-k): what hyserve runs",
            result.get("heldout_ppl_exported"))]
    for key, value in result.items():
        if key.startswith("heldout_ppl_exported_index_topk_"):
            ppl.append((f"exported with index_topk {key.rsplit('_', 1)[1]} (what the indexer learnt)", value))
    scored = result.get("heldout_scored_tokens")
    lines.append(f"- held-out perplexity ({scored:,} scored tokens of the held-out split):" if scored
                 else "- held-out perplexity:")
    for name, value in ppl:
        lines.append(f"  - {name}: **{value:.2f}**" if finite(value) else f"  - {name}: {value}")
    if finite(result.get("bits_per_byte_exported")):
        lines.append(f"- {result['bits_per_byte_exported']:.3f} bits per byte of held-out text.")
    if steps:
        tenth = max(1, len(steps) // 10)
        picked = steps[::tenth]
        if picked[-1] is not steps[-1]:
            picked.append(steps[-1])
        lines.append("- training loss: " + ", ".join(f"step {r['step']}: {r['loss']:.3f}" for r in picked) + ".")
    lines.append("- `loss_curve.jsonl` and `result.json` of the run are beside the weights.")
    lines += ["", END]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="src", required=True, help="the exported folder of a training run")
    p.add_argument("--models-dir", default=os.path.join(ROOT, "models", "tiny-k3-speaks"))
    p.add_argument("--golden-dir", default=os.path.join(ROOT, "tests", "fixtures", "tiny_k3_speaks"))
    p.add_argument("--python", default=sys.executable, help="the interpreter with torch for check_export.py")
    args = p.parse_args()

    src, dst = args.src, args.models_dir
    for name in ("config.json", "model.safetensors", "result.json") + TOKENIZER_FILES:
        if not os.path.exists(os.path.join(src, name)):
            fail(f"{src} has no {name}")
    for name in TOKENIZER_FILES:
        if not filecmp.cmp(os.path.join(src, name), os.path.join(dst, name), shallow=False):
            fail(f"{name} of {src} differs from {dst}'s: the model was trained on another tokenizer")
    size = os.path.getsize(os.path.join(src, "model.safetensors"))
    if size >= MAX_BYTES:
        fail(f"model.safetensors is {size:,} bytes, over the bundled limit of {MAX_BYTES:,}")
    with open(os.path.join(src, "result.json")) as f:
        result = json.load(f)
    if result.get("non_finite_steps_skipped", 0):
        fail(f"the run skipped {result['non_finite_steps_skipped']} non-finite steps")
    if not finite(result.get("heldout_ppl_exported")):
        fail(f"the exported checkpoint's held-out perplexity is {result.get('heldout_ppl_exported')}")

    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    for name in ("loss_curve.jsonl", "result.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    print(json.dumps({"installed": dst, "bytes": size}))

    os.makedirs(args.golden_dir, exist_ok=True)
    check = subprocess.run([args.python, os.path.join(HERE, "check_export.py"), "--model", dst, "--write-golden",
                            args.golden_dir, "--no-hyserve"], cwd=ROOT)
    if check.returncode != 0:
        fail("check_export.py failed on the installed model (see above); nothing else was written")

    readme = os.path.join(dst, "README.md")
    with open(readme) as f:
        text = f.read()
    steps, evals = read_curve(os.path.join(src, "loss_curve.jsonl"))
    section = weights_section(result, steps, evals, size)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    text = text.replace("**The weights are not trained yet.** ", "")
    with open(readme, "w") as f:
        f.write(text)
    print(json.dumps({"readme": readme, "golden": args.golden_dir}))
    print("left to do: add {\"tiny_k3_speaks\", \"models/tiny-k3-speaks\", \"tests/fixtures/tiny_k3_speaks\"} to "
          "tests/golden_util.h kGoldenFixtures; measure issue 50 item 5 into BENCHMARKS.md")


if __name__ == "__main__":
    main()
