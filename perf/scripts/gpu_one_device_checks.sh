#!/usr/bin/env bash
# Every capability's checks on one GPU, in one call: attention (bf16 drawn, contract and wider
# laws, spec cases, kept mutants) and the distributed capabilities at world size 1 on NCCL
# (their CUDA paths: bf16 FSDP compute, the Triton kernel inside ring attention, pipeline and
# tensor-parallel layers on the device), then the newer capabilities (checkpointing, ring
# collectives, gradient scaler, sampler, composed parallelism) the same way.  Logs and reports go to
# $OUT (default gpu-out/); summary.txt has one line per stage.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OPENBLAS_NUM_THREADS=1
{ nvidia-smi -L; python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } > "$OUT/device.txt" 2>&1
stage() {  # stage NAME SECONDS pytest-args...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" python -m pytest "$@" -p no:cacheprovider -q --device cuda --hypothesis-profile ci \
      --conformance-report "$OUT/$name" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.log")" >> "$OUT/summary.txt"
}
stage attention "${ATTENTION_S:-300}" -n 8 properties/test_attention.py conformance/spec/test_attention.py \
    conformance/selftests/test_mutants.py -k "attention or contract_law or cs336 or api_contract"
stage distributed "${DISTRIBUTED_S:-200}" -n 8 properties/test_fsdp.py properties/test_context_parallel.py \
    properties/test_pipeline.py properties/test_tensor_parallel.py conformance/spec/test_fsdp.py \
    conformance/spec/test_context_parallel.py conformance/spec/test_pipeline.py conformance/spec/test_tensor_parallel.py
stage newer "${NEWER_S:-150}" -n 8 properties/test_checkpointing.py properties/test_ring_collectives.py \
    properties/test_grad_scaler.py properties/test_sampler.py properties/test_composed.py conformance/spec/test_checkpointing.py \
    conformance/spec/test_ring_collectives.py conformance/spec/test_grad_scaler.py conformance/spec/test_sampler.py \
    conformance/spec/test_composed.py
cat "$OUT/summary.txt"
