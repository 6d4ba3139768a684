#!/usr/bin/env bash
# Tuning data for the Gluon flavour in one Hopper call: tile candidates (checked against the
# Triton flavour, timed), host time of a short call, the GPT step with SDPA, the Triton and
# the Gluon flavour (eager and torch.compile'd).
#     OUT=DIR PYTHONPATH=. bash perf/scripts/gpu_gluon_tune.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/device.txt" 2>&1
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.txt"
}
step tune "${TUNE_S:-200}" python -m perf.tune.gluon_configs --out "$OUT"
step model "${MODEL_S:-200}" python -m perf.bench.model --device cuda --sizes small --attention sdpa triton gluon \
    --precision bf16 --modes step --batch 4 --context 256 1024 4096 --steps 10 --warmup 2 --compile off on --no-plots --out "$OUT/model"
cp "$OUT/model/"*.md "$OUT/model.md" 2>/dev/null; rm -rf "$OUT/model"
cat "$OUT/summary.txt"
