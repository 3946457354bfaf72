#!/usr/bin/env bash
# Issue 26 item 4: the serving frontier of one model on this machine's GPU (or CPU), on the
# agentic workload, with TPOT at concurrency 1 beside the decode step's byte bound.
#
#   OUT=dir MODEL=bundled|kl48 DEVICE=cuda bash tools/frontier.sh
#
# MODEL  bundled: models/tiny-k3-speaks (its checkpoint)
#        kl48:    bench/configs/kimi-linear-48b-shaped.json served with --load-format dummy
#                 (random bf16 weights, ~98 GB: one H200), the bundled tokenizer
# Steps: `hyserve serve` on a free port; `hyserve bench sweep --dataset-name agentic` over
# $CONCURRENCIES (each point max($SESSIONS, 2 x concurrency) sessions) into $OUT/sweep-$MODEL
# (concurrency-N.json, sweep_summary.json, frontier/ttft/tpot .svg and .png); then, on a GPU,
# hyserve_step_bench at batch 1 on the same model (gpu_us against bound_us: the weight and
# cache bytes a step reads over the copy rate of the same run) into $OUT/step-$MODEL.jsonl.
# Environment: BIN (default build-gpu/hyserve, build/hyserve on the CPU), STEP_BENCH,
# CONCURRENCIES (default 1,2,4,8,16,32,64,128,256), SESSIONS (default 8), the agentic shape
# SYSTEM_LEN 2048, USER_LEN 128, TOOL_LEN 512, OUTPUT_LEN 128, MEAN_TURNS 4, MAX_TURNS 8,
# THINK_S 0.5, MAX_MODEL_LEN 32768.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-frontier-out}
MODEL=${MODEL:-bundled}
DEVICE=${DEVICE:-cuda}
if [[ $DEVICE == cuda ]]; then BIN=${BIN:-build-gpu/hyserve}; else BIN=${BIN:-build/hyserve}; fi
STEP_BENCH=${STEP_BENCH:-$(dirname "$BIN")/hyserve_step_bench}
CONCURRENCIES=${CONCURRENCIES:-1,2,4,8,16,32,64,128,256}
mkdir -p "$OUT"

case $MODEL in
  bundled)
    DIR=models/tiny-k3-speaks
    LOAD=auto
    ;;
  kl48)
    DIR=$(mktemp -d)/kimi-linear-48b-shaped
    mkdir -p "$DIR"
    cp bench/configs/kimi-linear-48b-shaped.json "$DIR/config.json"
    cp models/tiny-k3-speaks/tiktoken.model models/tiny-k3-speaks/tokenizer_config.json "$DIR/"
    LOAD=dummy
    ;;
  *)
    echo "MODEL must be bundled or kl48, got $MODEL" >&2
    exit 2
    ;;
esac

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" serve "$DIR" --port "$PORT" --device "$DEVICE" --load-format "$LOAD" \
  --max-num-seqs 256 --max-model-len "${MAX_MODEL_LEN:-32768}" >"$OUT/serve-$MODEL.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { tail -20 "$OUT/serve-$MODEL.log"; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "server not up" >&2; exit 1; }
grep -E "serving|kernel plan|memory" "$OUT/serve-$MODEL.log" | head -5 || true

"$BIN" bench sweep --base-url "http://127.0.0.1:$PORT" --tokenizer "$DIR" \
  --dataset-name agentic --num-prompts "${SESSIONS:-8}" --prompts-per-concurrency 2 \
  --concurrencies "$CONCURRENCIES" --num-gpus 1 --disable-tqdm \
  --agentic-system-len "${SYSTEM_LEN:-2048}" --agentic-user-len "${USER_LEN:-128}" \
  --agentic-tool-result-len "${TOOL_LEN:-512}" --agentic-output-len "${OUTPUT_LEN:-128}" \
  --agentic-mean-turns "${MEAN_TURNS:-4}" --agentic-max-turns "${MAX_TURNS:-8}" \
  --agentic-think-time-s "${THINK_S:-0.5}" --result-dir "$OUT/sweep-$MODEL"
python3 - "$OUT/sweep-$MODEL/sweep_summary.json" <<'EOF'
import json, sys
for p in json.load(open(sys.argv[1]))["points"]:
    print(json.dumps({k: p.get(k) for k in ("concurrency", "completed", "output_tokens_per_s_per_gpu",
                                            "output_tokens_per_s_per_user")}))
EOF
kill $SERVER 2>/dev/null || true
wait $SERVER 2>/dev/null || true
trap - EXIT

if [[ $DEVICE == cuda && -x $STEP_BENCH ]]; then
  if [[ $MODEL == kl48 ]]; then
    "$STEP_BENCH" --full-config "$DIR/config.json" --batches 1 --label "$MODEL" >"$OUT/step-$MODEL.jsonl"
  else
    "$STEP_BENCH" --model "$DIR" --batches 1 --label "$MODEL" >"$OUT/step-$MODEL.jsonl"
  fi
  grep -E '"bound_us"|gpu_over_bound' "$OUT/step-$MODEL.jsonl" | cut -c1-300 || true
fi
