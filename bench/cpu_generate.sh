#!/usr/bin/env bash
# The bundled model on the CPU, as `hyserve generate` runs it (issue 49): a 4,096-token prompt
# (ids 5 + 7919 i mod 900), then 128 decoded tokens at ~4.1K of context; best of --reps runs.
# One JSON line: prefill ms and tokens/s, decode ms per token and tokens/s.
#   bash bench/cpu_generate.sh [--binary build/hyserve] [--reps 3] [--label L] [-- generate flags]
set -euo pipefail
binary=build/hyserve reps=3 label=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
ids=$(python3 -c "print(','.join(str(5 + (i * 7919) % 900) for i in range(4096)))")
for ((r = 0; r < reps; ++r)); do
  "$binary" generate "$@" --prompt-ids "$ids" --max-tokens 129 --ignore-eos 2>&1 | grep '^prompt:'
done | python3 -c "
import json, re, sys
rows = [re.search(r'prompt: (\d+) tokens, prefill ([0-9.]+) ms; generated (\d+) tokens, decode ([0-9.]+) ms', l) for l in sys.stdin]
rows = [(int(m[1]), float(m[2]), int(m[3]), float(m[4])) for m in rows if m]
assert rows, 'no run finished'
prompt = rows[0][0]
prefill_ms = min(r[1] for r in rows)
# The first generated token comes from the prefill: decode time covers the other tokens.
decode_ms = min(r[3] / (r[2] - 1) for r in rows)
print(json.dumps({'bench': 'cpu_generate', 'label': '$label', 'flags': '$*', 'threads': $(nproc),
                  'prompt_tokens': prompt, 'prefill_ms': round(prefill_ms, 1),
                  'prefill_tokens_per_s': round(prompt / prefill_ms * 1e3),
                  'decode_ms_per_token': round(decode_ms, 3),
                  'decode_tokens_per_s': round(1e3 / decode_ms, 1), 'runs': len(rows)}))"
