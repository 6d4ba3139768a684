#!/usr/bin/env bash
# One GPU, one call: the activation-checkpointing benchmark (xl, 4 x 2048, bf16; predictions
# printed first), the gradient-scaler benchmark, and the new capabilities' laws on CUDA at
# the world sizes one GPU allows.  Results under $OUT (default gpu-out/).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OPENBLAS_NUM_THREADS=1 PYTHONPATH=.
{ nvidia-smi -L; python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/device.txt" 2>&1
step() {  # step NAME SECONDS command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.txt"
}
step checkpointing_bench "${CKPT_S:-240}" python -m perf.bench.checkpointing
step grad_scaler_bench "${SCALER_S:-90}" python -m perf.bench.grad_scaler --world-size 1
step laws "${LAWS_S:-200}" python -m pytest properties/test_checkpointing.py properties/test_grad_scaler.py \
    properties/test_sampler.py properties/test_ring_collectives.py conformance/spec/test_checkpointing.py \
    conformance/spec/test_grad_scaler.py -n 8 -p no:cacheprovider -q --device cuda --hypothesis-profile ci
cat "$OUT/summary.txt"
