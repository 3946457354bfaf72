#!/usr/bin/env bash
# One device call that verifies the CUDA code and measures the open GPU figures:
#   builds build-gpu (Release, -DHYSERVE_WERROR=OFF: the GPU machine's g++ 13 warns where
#   CI's g++ 12 does not), runs every gpu-labelled ctest test in its own process (a sticky
#   CUDA error fails one test, not the rest), then the benchmarks named in $BENCH.
# Run from the repository root on the GPU machine, .deps carried (scripts/make_gpu_deps.sh):
#   run(command="OUT=$OUT bash tools/device_check.sh", carry=[".deps"])
# Environment:
#   OUT          where the logs go (default ./device-out); packed as $OUT/logs.tgz
#   BODY_S       seconds for everything before packing (default 540)
#   TESTS_S      seconds for the GPU tests (default 240)
#   GPU_FILTER   a ctest -R regex to run only some GPU tests (default: all)
#   TESTS_J      GPU tests run at once (default 4; one GPU, small tests)
#   MODEL_TESTS_ENV  non-empty, e.g. "HYSERVE_MLA_FLASH_WGMMA=1": the model-level GPU tests again
#                with these variables set
#   BENCH        space-separated benchmarks after the tests, any of:
#                  sampler   hyserve_sampler_bench + tools/bench_sampler_torch.py
#                  mla       hyserve_layer_bench (K3.1 Pro slice at its auto and bf16 latents,
#                            Kimi Linear shape), without and with the opt-in warpgroup kernels
#                  lora      hyserve_step_bench on the tiny K3 and the K3.1 Pro slice, LoRA
#                            rank 0 and 32 (issue 48 item 2's cost; issue 51's byte bounds)
#                  mlaprefill  hyserve_mla_prefill_bench (flash and absorbed, Kimi Linear and
#                            DeepSeek head counts, 4K / 16K queries, a 2K append on a 150K
#                            prefix; sparse top-k prefill over the bf16 latent, K3's 96 and
#                            V3.2's 64 heads) + tools/bench_mla_torch.py
#                  indexer   hyserve_indexer_bench (mma.sync and FP8 wgmma scorers, 256 queries
#                            over 128K and 1M keys, 32 and 64 heads) + tools/bench_indexer_torch.py
#                  kda       hyserve_kda_bench --case prefill, the inter-chunk V slice fixed at 64
#                            (before) and picked by the SM count (now), 12 / 32 / 96 heads
#                  speaks    tools/measure_speaks_cpu.py --device cuda (issue 50 item 5: n-gram
#                            speculation, multi-turn prefix hits, generate on the bundled model)
#                (default: "sampler mla lora")
# Prints a summary (build result, tests passed / failed with the failures' first lines,
# each benchmark's exit status); the JSON lines are in the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
L=$OUT/logs
mkdir -p "$L"
BENCH=${BENCH-sampler mla lora}
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }

body() {
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$L/gpu.txt"
  if [[ ! -f build-gpu/build.ninja ]] || ! grep -q "HYSERVE_WERROR:BOOL=OFF" build-gpu/CMakeCache.txt; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" \
      -DHYSERVE_WERROR=OFF >"$L/cmake.log" 2>&1 || { tail -30 "$L/cmake.log"; return 1; }
  fi
  local jobs
  jobs=$(($(nproc) > 1 ? $(nproc) - 1 : 1))
  ninja -C build-gpu -j"$jobs" >"$L/build.log" 2>&1
  local brc=$?
  echo "build rc $brc at $(elapsed) s"
  if [[ $brc -ne 0 ]]; then
    grep -E "error|FAILED" "$L/build.log" | head -30
    return 1
  fi
  (cd build-gpu && timeout "${TESTS_S:-240}" ctest -L gpu ${GPU_FILTER:+-R "$GPU_FILTER"} \
    -j"${TESTS_J:-4}" --timeout 120 --output-on-failure) >"$L/gpu_tests.log" 2>&1
  echo "gpu tests rc $? at $(elapsed) s"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess aborted\)" \
    "$L/gpu_tests.log" | head -40
  grep -E "Failure|Expected|Which is|actual|error:" "$L/gpu_tests.log" | head -40
  if [[ -n "${MODEL_TESTS_ENV:-}" ]]; then
    # The model-level GPU tests again with MODEL_TESTS_ENV's variables (a path not yet the default).
    (cd build-gpu && env $MODEL_TESTS_ENV timeout 120 ctest -L gpu \
      -R "GpuModel|GpuLogits|GpuPrefixCache|GpuDcp|GpuGolden|GpuSpeculative|GpuRlScoring" \
      -j"${TESTS_J:-4}" --timeout 100 --output-on-failure) >"$L/gpu_tests_model_env.log" 2>&1
    echo "model gpu tests, $MODEL_TESTS_ENV: rc $? at $(elapsed) s"
    grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$L/gpu_tests_model_env.log" | head -20
  fi
  local C=.deps/configs/kimi-k3.1-pro-published.json
  for b in $BENCH; do
    case $b in
      sampler)
        timeout 60 ./build-gpu/hyserve_sampler_bench >"$L/sampler.jsonl" 2>&1
        echo "sampler bench rc $? at $(elapsed) s"
        timeout 60 python3 tools/bench_sampler_torch.py >"$L/sampler_torch.jsonl" 2>&1
        echo "torch sampler rc $?"
        ;;
      mla)
        # The slices' layer benchmark at the serving-default latent (K3.1 Pro: FP8; Kimi
        # Linear: its auto), K3.1 Pro's bf16 latent too, each without and with the opt-in
        # warpgroup kernels (indexer logits, dense flash prefill, sparse bf16 prefill).
        local wg="HYSERVE_INDEXER_WGMMA=1 HYSERVE_MLA_FLASH_WGMMA=1 HYSERVE_MLA_SPARSE_WGMMA=1"
        for v in base wgmma; do
          local e=""
          [[ $v == wgmma ]] && e=$wg
          env $e timeout 90 ./build-gpu/hyserve_layer_bench --config "$C" --iters 3 \
            >"$L/layer_k31_$v.jsonl" 2>&1
          echo "layer k3.1 (auto latent) $v rc $? at $(elapsed) s"
          env $e timeout 90 ./build-gpu/hyserve_layer_bench --config "$C" --iters 3 \
            --kv-cache-dtype bf16 --batches 1 >"$L/layer_k31_bf16_$v.jsonl" 2>&1
          echo "layer k3.1 (bf16 latent) $v rc $? at $(elapsed) s"
          env $e timeout 60 ./build-gpu/hyserve_layer_bench \
            --config bench/configs/kimi-linear-48b-shaped.json --iters 3 \
            >"$L/layer_kl_$v.jsonl" 2>&1
          echo "layer kimi-linear $v rc $? at $(elapsed) s"
        done
        ;;
      lora)
        # The tiny K3 (LoRA's launches against a small step) and the K3.1 Pro slice (against
        # a real layer's bytes); the step's byte bound is printed beside each.
        for r in 0 32; do
          timeout 60 ./build-gpu/hyserve_step_bench --label "lora$r" --lora-rank "$r" \
            --model models/tiny-kimi-k3 --batches 1,8,64 >"$L/step_lora$r.jsonl" 2>&1
          echo "step bench tiny lora rank $r rc $? at $(elapsed) s"
          timeout 90 ./build-gpu/hyserve_step_bench --label "lora$r" --lora-rank "$r" \
            --config "$C" --batches 1,8,64 >"$L/step_k31_lora$r.jsonl" 2>&1
          echo "step bench k3.1 slice lora rank $r rc $? at $(elapsed) s"
        done
        ;;
      mlaprefill)
        timeout 120 ./build-gpu/hyserve_mla_prefill_bench --heads 32,128 --tokens 4096,16384 \
          >"$L/mla_prefill.jsonl" 2>&1
        echo "mla prefill bench rc $? at $(elapsed) s"
        timeout 60 ./build-gpu/hyserve_mla_prefill_bench --heads 16,128 --tokens 2048 \
          --prefix 150000 --absorbed-max-tflop 0 >"$L/mla_prefill_append.jsonl" 2>&1
        echo "mla prefill append bench rc $? at $(elapsed) s"
        timeout 90 ./build-gpu/hyserve_mla_prefill_bench --heads 96,64 --tokens 4096 \
          --sparse-context 4096,131072 >"$L/mla_prefill_sparse.jsonl" 2>&1
        echo "mla sparse prefill bench rc $? at $(elapsed) s"
        timeout 90 python3 tools/bench_mla_torch.py --heads 32,128 --tokens 4096,16384 \
          >"$L/mla_prefill_torch.jsonl" 2>&1
        echo "torch mla prefill rc $? at $(elapsed) s"
        cat "$L"/mla_prefill*.jsonl | cut -c1-260
        ;;
      indexer)
        timeout 120 ./build-gpu/hyserve_indexer_bench --heads 32,64 --queries 256,2048 \
          --context 131072,1048576 >"$L/indexer.jsonl" 2>&1
        echo "indexer bench rc $? at $(elapsed) s"
        timeout 120 python3 tools/bench_indexer_torch.py --heads 32,64 --queries 256,2048 \
          --context 131072,1048576 >"$L/indexer_torch.jsonl" 2>&1
        echo "torch indexer rc $? at $(elapsed) s"
        cat "$L"/indexer*.jsonl | cut -c1-260
        ;;
      kda)
        timeout 150 ./build-gpu/hyserve_kda_bench --case prefill --heads 12,32,96 \
          --lengths 4096,16384 --seqs 1 --v-slices 64,0 --iters 8 >"$L/kda_prefill.jsonl" 2>&1
        echo "kda prefill bench rc $? at $(elapsed) s"
        cut -c1-200 "$L/kda_prefill.jsonl"
        ;;
      speaks)
        timeout 240 python3 tools/measure_speaks_cpu.py --binary build-gpu/hyserve --device cuda \
          >"$L/speaks_cuda.jsonl" 2>&1
        echo "speaks (n-gram, prefix cache, generate) on cuda rc $? at $(elapsed) s"
        ;;
      *) echo "unknown benchmark $b" ;;
    esac
  done
}

timeout "${BODY_S:-540}" bash -c "$(declare -f body elapsed); t0=$t0; L=$L; BENCH='$BENCH'; body"
echo "body rc $? at $(elapsed) s"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$L"
ls -la "$OUT"
