#!/usr/bin/env bash
# The two-GPU runs (NCCL, W = 2) in stages, each under its own time limit, so one device call
# holds as many as fit and a stage that hangs or runs long costs only its own slot.
#   OUT=dir bash perf/scripts/gpu_two_gpu_runs.sh STAGE [STAGE ...]    (everything in $OUT/two-gpu-<stages>.tgz)
# Stages:
#   tests            properties + spec cases of every distributed capability, every case pinned to W = 2
#   tests_ddp        the same for DDP alone (after a change to it)
#   ddp ddp_again    data-parallel step, gpt1_5b, 4 x 256 a rank (the issue's configuration), ours and torch DDP
#                    interleaved per bucket size 1 5 25 100 250 MB; ddp_again is a second run, in the reverse order
#                    (drift over a run then shows as a difference between the two)
#   ddp_big ddp_big_again  the same sweep where the GPU work dominates the step: gpt1_5b, 12 x 1024 a rank,
#                    20 steps after 3; ddp_big_again in the reverse order (DDP_BIG_BATCH=6 on 80 GB cards: torch DDP
#                    peaks at 86-92 GiB at 12 x 1024)
#   fsdp             ours (full shard, shard-grad-op) vs torch fully_shard, gpt1_5b, 4 x 256, bf16 / fp32 reduce
#   zero             ZeRO-1 (sharded optimizer) vs torch ZeroRedundancyOptimizer, same model
#   ring_attention   ring attention vs our one-GPU FlashAttention-2, bf16, d 64 / 128, N 16k..128k
#   tp pp composed   tensor parallelism (large: xl has 25 heads, which 2 does not divide; 2.7B did not fit the stage), pipeline AFAB vs 1F1B (m 1..16), composed meshes on 2 ranks
#   scaler           gradient scaler with DDP: the cost of the agreed non-finite check
#   collectives      our ring collectives vs NCCL's, 1 MB .. 1 GB
# Stage limits in seconds: STAGE_LIMIT_<stage> (defaults below).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-gpu-out}; W=$(mktemp -d); mkdir -p "$OUT"
STAGES=("$@"); NAME=$(IFS=-; echo "${STAGES[*]}")
nvidia-smi topo -m > "$W/topology.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/gpus.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())), 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))" | tee "$W/env.txt"

DDP_VARIANTS="local bucketed_1 torch_ddp_1 bucketed_5 torch_ddp_5 bucketed_25 torch_ddp_25 bucketed_100 torch_ddp_100 bucketed_250 torch_ddp_250 local_again"
DIST_TESTS="properties/test_ddp.py properties/test_sharded_optimizer.py properties/test_fsdp.py properties/test_context_parallel.py
  properties/test_tensor_parallel.py properties/test_pipeline.py properties/test_ring_collectives.py properties/test_grad_scaler.py
  properties/test_sampler.py properties/test_composed.py
  conformance/spec/test_ddp.py conformance/spec/test_sharded_optimizer.py conformance/spec/test_fsdp.py conformance/spec/test_context_parallel.py
  conformance/spec/test_tensor_parallel.py conformance/spec/test_pipeline.py conformance/spec/test_ring_collectives.py
  conformance/spec/test_grad_scaler.py conformance/spec/test_sampler.py conformance/spec/test_composed.py"

stage() {  # stage NAME DEFAULT_LIMIT COMMAND...: run under its limit (SIGINT first, so pytest still reports), log and time it
  local name=$1 limit_var="STAGE_LIMIT_$1" t0=$SECONDS; local limit=${!limit_var:-$2}; shift 2
  echo "== stage $name (limit ${limit}s): $*" | tee -a "$W/stages.txt"
  timeout -s INT -k 20 "$limit" "$@" > "$W/$name.log" 2>&1; local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s" | tee -a "$W/stages.txt"; tail -n 30 "$W/$name.log"
  tar czf "$OUT/two-gpu-$NAME.tgz" -C "$W" . && cp "$W/stages.txt" "$OUT/"  # after every stage: a cut call keeps what ran
}

for s in "${STAGES[@]}"; do
  case $s in
    tests) stage tests 240 python3 -m pytest $DIST_TESTS --device cuda --world-size 2 -n 2 --hypothesis-profile ci \
             -p no:cacheprovider -q -rs --conformance-report "$W/dist-w2" ;;
    tests_ddp) stage tests_ddp 150 python3 -m pytest properties/test_ddp.py conformance/spec/test_ddp.py --device cuda --world-size 2 -n 2 \
             --hypothesis-profile ci -p no:cacheprovider -q -rs --conformance-report "$W/ddp-w2" ;;
    ddp|ddp_again) mkdir -p "$W/$s"; V=$DDP_VARIANTS; [ $s = ddp_again ] && V=$(echo $DDP_VARIANTS | tr ' ' '\n' | tac | tr '\n' ' ')
             stage $s 150 python3 -m perf.bench.ddp --out "$W/$s" --iters 30 --warmup 5 \
             --time-budget-s 130 --timeout 60 --variants $V ;;
    ddp_big|ddp_big_again) mkdir -p "$W/$s"; V=$DDP_VARIANTS; [ $s = ddp_big_again ] && V=$(echo $DDP_VARIANTS | tr ' ' '\n' | tac | tr '\n' ' ')
             stage $s 170 python3 -m perf.bench.ddp --out "$W/$s" --batch ${DDP_BIG_BATCH:-12} --seq 1024 --iters 20 --warmup 3 \
             --time-budget-s 150 --timeout 60 --variants $V ;;
    fsdp) stage fsdp 120 python3 -m perf.bench.fsdp --size gpt1_5b --world-size 2 --batch 4 --seq 256 --steps 15 --warmup 3 ;;
    zero) mkdir -p "$W/zero"; stage zero 120 python3 -m perf.bench.sharded_optimizer --out "$W/zero" --world-size 2 --deadline 100 ;;
    ring_attention) stage ring_attention 150 python3 -m perf.bench.ring_attention --lengths 16384 32768 65536 131072 \
             --reps 5 --out "$W/ring_attention.jsonl" ;;
    tp) stage tp 100 python3 -m perf.bench.tensor_parallel --sizes large --world-size 2 --dtype bf16 --out "$W/tp.json" ;;
    pp) stage pp 80 python3 -m perf.bench.pipeline --out "$W/pp.json" ;;
    composed) stage composed 80 python3 -m perf.bench.composed ;;
    scaler) stage scaler 60 python3 -m perf.bench.grad_scaler ;;
    collectives) stage collectives 60 python3 -m perf.bench.ring_collectives ;;
    *) echo "unknown stage $s" | tee -a "$W/stages.txt" ;;
  esac
done
ls -la "$OUT"
