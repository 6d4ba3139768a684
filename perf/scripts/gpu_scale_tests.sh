#!/usr/bin/env bash
# One device call on a host of several GPUs: the distributed checks on NCCL with world sizes
# drawn from 1 to the GPU count, then pinned to the GPU count (impl, torch DDP,
# ZeroRedundancyOptimizer), run side by side; then the sharded-optimizer benchmark.
#   OUT=dir bash perf/scripts/gpu_scale_tests.sh      (everything lands in $OUT/scale-tests.tgz)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-gpu-out}; W=$(mktemp -d)
N=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))" | tee "$W/env.txt"
DDP="properties/test_ddp.py conformance/selftests/test_ddp_mutants.py conformance/spec/test_ddp.py"
ZERO="properties/test_sharded_optimizer.py conformance/spec/test_sharded_optimizer.py conformance/selftests/test_sharded_optimizer_mutants.py"
COMMON="--device cuda --hypothesis-profile ci -p no:cacheprovider -q -rs -n 3"
T=${SCALE_TEST_TIMEOUT:-300}
timeout $T python3 -m pytest $DDP $ZERO conformance/selftests/test_harness.py $COMMON --conformance-report "$W/impl-drawn" > "$W/impl-drawn.log" 2>&1 &
timeout $T python3 -m pytest properties/test_ddp.py properties/test_sharded_optimizer.py $COMMON --world-size $N --conformance-report "$W/impl-pinned" > "$W/impl-pinned.log" 2>&1 &
timeout $T python3 -m pytest properties/test_ddp.py conformance/spec/test_ddp.py --target conformance.adapters.torch_ddp $COMMON --world-size $N --conformance-report "$W/torch-ddp-pinned" > "$W/torch-ddp-pinned.log" 2>&1 &
timeout $T python3 -m pytest properties/test_sharded_optimizer.py conformance/spec/test_sharded_optimizer.py --target conformance.adapters.torch_zero $COMMON --conformance-report "$W/torch-zero-drawn" > "$W/torch-zero-drawn.log" 2>&1 &
wait
for f in "$W"/*.log; do echo "== $f"; grep -E "passed|failed|error" "$f" | tail -n 2; done
for f in "$W"/*-*.md; do echo "== $f"; sed -n '1,40p' "$f"; done
if [ -n "${SCALE_BENCH_WORLDS:-}" ]; then
  for w in $SCALE_BENCH_WORLDS; do
    mkdir -p "$W/zero-w$w"
    timeout ${SCALE_BENCH_TIMEOUT:-150} python3 -m perf.bench.sharded_optimizer --out "$W/zero-w$w" --world-size $w --deadline $(( ${SCALE_BENCH_TIMEOUT:-150} - 20 )) 2>&1 | tail -n 25
  done
fi
tar czf "$OUT/scale-tests.tgz" -C "$W" . && ls -la "$OUT"
