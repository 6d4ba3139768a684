#!/usr/bin/env bash
# One GPU, one call: the tensor-parallel laws at W = 1 on NCCL (their eager yardstick now runs
# on the ranks' device), the accounting benchmark (MFU against a peak measured in the same
# run, model states against the ZeRO formula), and torch.compile beside eager, SDPA and our
# kernel in the attention sweep and the model step.  Results under $OUT (default gpu-out/).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OPENBLAS_NUM_THREADS=1
{ nvidia-smi -L; python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/device.txt" 2>&1
step() {  # step NAME SECONDS command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $? $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.txt"
}
step tensor_parallel "${TP_S:-150}" python -m pytest properties/test_tensor_parallel.py conformance/spec/test_tensor_parallel.py \
    -n 8 -p no:cacheprovider -q --device cuda --hypothesis-profile ci --conformance-report "$OUT/tensor_parallel"
step accounting "${ACCOUNTING_S:-150}" python -m perf.bench.accounting --device cuda --sizes small medium large xl \
    --batch 4 --context 512 --out "$OUT/accounting"
step attention_compile "${ATTENTION_S:-120}" python -m perf.bench.attention --device cuda --seq 128 512 2048 8192 --dims 64 \
    --dtypes bf16 --impls triton sdpa_flash compiled_eager eager --batch 8 --heads 16 --time-budget-s 100 \
    --out "$OUT/attention_compile"
step model_compile "${MODEL_S:-130}" python -m perf.bench.model --device cuda --sizes small medium --attention sdpa triton \
    --precision bf16 --compile off on --context 512 --modes forward_backward step --no-plots --out "$OUT/model_compile"
cat "$OUT/summary.txt"
