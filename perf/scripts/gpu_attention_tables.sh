#!/usr/bin/env bash
# The attention tables of issue 17's goals, re-measured in one call on one GPU (bf16, do_bench
# medians of interleaved rounds): the CS336 sweep (B1 H1, N 128..65536, d 64/128, causal and
# full) with SDPA flash and cuDNN, the tracked shapes, the GPT step with our kernel and SDPA,
# and the sweep counted against SDPA flash.
#     OUT=DIR PYTHONPATH=. bash perf/scripts/gpu_attention_tables.sh
set -uo pipefail
S=${OUT:-perf-out}/tables
mkdir -p "$S"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$S/device.txt"
step() {  # name, limit in seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$S/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s" >> "$S/steps.txt"
}
common=(--device cuda --dtypes bf16 --impls triton sdpa_flash sdpa_cudnn --rounds 3 --no-plots)
step sweep 240 python -m perf.bench.attention "${common[@]}" --seq 128:65536 --dims 64 128 --masks causal full \
    --warmup-ms 10 --rep-ms 25 --out "$S/sweep"
step leaderboard 60 python -m perf.bench.attention "${common[@]}" --seq 16384 --dims 64 --masks causal \
    --batch 1 --heads 16 --out "$S/leaderboard"
step b8h16 60 python -m perf.bench.attention "${common[@]}" --seq 1024 --dims 64 --masks causal \
    --batch 8 --heads 16 --out "$S/b8h16"
step b4h16 60 python -m perf.bench.attention "${common[@]}" --seq 4096 --dims 128 --masks full \
    --batch 4 --heads 16 --out "$S/b4h16"
step model 120 python -m perf.bench.model --device cuda --sizes small medium --attention sdpa triton \
    --precision bf16 --modes step --batch 4 --context 256 512 1024 2048 4096 --steps 10 --no-plots --out "$S/model"
python perf/scripts/attention_vs_flash.py "$S/sweep/attention.json" > "$S/ours_vs_flash.md" 2>&1
cat "$S/steps.txt"; tail -2 "$S/ours_vs_flash.md"
