#!/usr/bin/env bash
# One device call on a host of several GPUs: all-reduce at every GPU count, the data-parallel
# step at 2 ranks with host-time and profiler diagnostics, and weak scaling at 1, 2, 4, ... GPUs.
#   OUT=dir bash perf/scripts/gpu_scale_bench.sh      (everything lands in $OUT/scale-bench.tgz)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-gpu-out}; W=$(mktemp -d); mkdir -p "$W/allreduce" "$W/ddp" "$W/scaling"
nvidia-smi topo -m > "$W/topology.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))" | tee "$W/env.txt"
timeout 130 python3 -m perf.bench.allreduce --out "$W/allreduce" --cpu-worlds --timeout 100 2>&1 | tail -n 30
timeout 200 python3 -m perf.bench.ddp --out "$W/ddp" --iters 20 --time-budget-s 170 --timeout 90 \
  --variants local bucketed_25 bucketed_25_side bucketed_250 bucketed_250_side individual torch_ddp_25 torch_ddp_250 local_again \
  --profile bucketed_25 bucketed_25_side torch_ddp_25 2>&1 | tail -n 45
timeout 230 python3 -m perf.bench.scaling --out "$W/scaling" --time-budget-s 200 --timeout 90 \
  --variants torch_ddp_25 torch_ddp_250 bucketed_250 bucketed_250_side 2>&1 | tail -n 30
tar czf "$OUT/scale-bench.tgz" -C "$W" . && ls -la "$OUT"
