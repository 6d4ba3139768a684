#!/usr/bin/env bash
# One device call on 2 GPUs: all-reduce, data-parallel step and sharded-optimizer benchmarks.
#   OUT=dir bash perf/scripts/gpu_distributed_bench.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
timeout 100 python3 -m perf.bench.allreduce --out "$OUT" --cpu-worlds 2 4 6 --cpu-max-mib 64 --timeout 80 2>&1 | tail -n 30
timeout 250 python3 -m perf.bench.ddp --out "$OUT" --time-budget-s 200 --timeout 120 2>&1 | tail -n 40
timeout 170 python3 -m perf.bench.sharded_optimizer --out "$OUT" --deadline 150 2>&1 | tail -n 25
cd "$OUT" && tar czf distributed-extras.tgz --exclude='*.tgz' . && find . -maxdepth 2 -type f ! -name '*.md' ! -name '*.png' ! -name '*.tgz' -delete; ls -laR
