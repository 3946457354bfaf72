#!/usr/bin/env bash
# Trains the tiny Kimi K3.1 Pro that speaks (issue 50) on the GPU machine in one call, from the
# repository root of the device copy; needs torch, numpy and safetensors, no network.
#
#   run(command="bash tools/tiny_k3/device_train.sh", carry=[".cache/tiny-k3-speaks/tokens"])
#
# The token ids come from tools/tiny_k3/tokenize_corpus.py, run beforehand on the CPU machine
# (git-ignored, 3.4 MB, so they must be carried). Extra arguments go to train.py (for example
# --max-steps 1000). Writes into $OUT (default ./out):
#   tiny-k3-speaks/               the exported checkpoint (published K3.1 Pro layout) + tokenizer,
#                                 with loss_curve.jsonl and result.json (held-out perplexity) beside it
#   loss_curve.jsonl, result.json the same two files
#   train.log, check.log          the trainer's output; the CPU self-test and the trained model's
#                                 torch-vs-k3_reference agreement (tools/tiny_k3/check_export.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
PYTHON=${PYTHON:-python3}
TOKENS=.cache/tiny-k3-speaks/tokens
mkdir -p "$OUT"
if [ ! -f "$TOKENS/train.u16" ] || [ ! -f "$TOKENS/heldout.u16" ]; then
  echo "missing $TOKENS/{train,heldout}.u16: run tools/tiny_k3/tokenize_corpus.py and carry $TOKENS" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PYTHON" -c "import torch, numpy, safetensors; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
start=$(date +%s)
"$PYTHON" tools/tiny_k3/train.py --out "$OUT" "$@" 2>&1 | tee "$OUT/train.log"
cp "$OUT/loss_curve.jsonl" "$OUT/result.json" "$OUT/tiny-k3-speaks/"
echo "training + export: $(( $(date +%s) - start )) s"
# The trained checkpoint read back by the float64 numpy reference vs the torch model (CPU, ~10 s).
"$PYTHON" tools/tiny_k3/check_export.py --model "$OUT/tiny-k3-speaks" --no-hyserve 2>&1 | tee "$OUT/check.log" || true
