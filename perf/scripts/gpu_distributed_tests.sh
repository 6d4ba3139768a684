#!/usr/bin/env bash
# One device call on 2 GPUs: the distributed checks on NCCL (impl, torch DDP, ZeroRedundancyOptimizer).
#   OUT=dir bash perf/scripts/gpu_distributed_tests.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
DIST="properties/test_ddp.py conformance/selftests/test_ddp_mutants.py conformance/spec/test_ddp.py properties/test_sharded_optimizer.py conformance/spec/test_sharded_optimizer.py conformance/selftests/test_sharded_optimizer_mutants.py conformance/selftests/test_harness.py"
timeout 280 python3 -m pytest $DIST --device cuda --hypothesis-profile ci -p no:cacheprovider -q -n 4 -rs \
  --conformance-report "$OUT/impl-distributed" 2>&1 | tee "$OUT/impl.log" | tail -n 45
timeout 110 python3 -m pytest properties/test_ddp.py conformance/spec/test_ddp.py --target conformance.adapters.torch_ddp \
  --device cuda --hypothesis-profile ci -p no:cacheprovider -q -n 4 2>&1 | tee "$OUT/torch_ddp.log" | tail -n 14
timeout 90 python3 -m pytest properties/test_sharded_optimizer.py conformance/spec/test_sharded_optimizer.py --target conformance.adapters.torch_zero \
  --device cuda --hypothesis-profile ci -p no:cacheprovider -q -n 4 2>&1 | tee "$OUT/torch_zero.log" | tail -n 14
