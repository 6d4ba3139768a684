#!/usr/bin/env bash
# The GPU gate: refuses a kernel change that is wrong or slower.
#
#   bash perf/gate/gpu_gate.sh [--save-baseline] [--profile gate|thorough] [--threshold PCT]
#
# 1. properties on CUDA: the Triton and Gluon kernels' laws with the gate profile (bf16 drawn;
#    a test asserts it), each law split over GATE_SHARDS shards, after a parallel warm-up
#    of Triton's cache; every other capability's laws with the ci profile (bounded)
# 2. conformance on CUDA, with the report written to $GATE_OUT (default gate-out/)
# 3. perf: perf/gate/test_bench_gate.py against the stored baseline for this GPU model
#    (a median regression over the threshold fails; default 8%, see perf/GATE.md), and
#    perf/gate/test_relative_gate.py (short sequences and a model step, against torch
#    measured beside ours)
# 4. distributed (only where two or more GPUs are visible): the multi-rank checks on NCCL
# 5. distributed4 (only where four or more GPUs are visible): the distributed spec cases and
#    the composed mesh's laws with the world size pinned to 4 (2 x 2 meshes, rings of 4,
#    uneven shards over 4, two replica groups), contract tier only, so it fits the gate
# Each stage's wall time is printed in the summary (perf/GATE.md records them).
# Exits non-zero on any failure or regression, and prints a short summary last.
set -u
cd "$(dirname "$0")/../.."

PROFILE=gate
THRESHOLD=8
SAVE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --save-baseline) SAVE=1 ;;
    --profile) PROFILE="$2"; shift ;;
    --threshold) THRESHOLD="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUTDIR="${GATE_OUT:-gate-out}"
mkdir -p "$OUTDIR"
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '_'))" 2>/dev/null) || GPU=""
if [ -z "$GPU" ]; then echo "gpu gate: no CUDA device visible" >&2; exit 2; fi
STORAGE="perf/gate/baselines/$GPU"
export NCCL_NVLS_ENABLE=0

status_of() { if [ "$1" -eq 0 ]; then echo pass; elif [ "$1" -eq -1 ]; then echo "NOT RUN (GATE_STAGES)"; else echo "FAIL (exit $1)"; fi; }
last_line() { if [ -f "$1" ]; then tail -n 1 "$1"; fi; }

# GATE_PYTEST_ARGS: pytest arguments for the properties and conformance runs (default "-n <cores, at most 16>
# --dist load --maxschedchunk 1"): each worker gets one test more as each of its tests ends, and
# perf/gate/longest_first.py orders the collection longest first by the last run's seconds
# (perf/gate/durations.json), which makes that close to longest-first scheduling; modelled on runs
# 29 and 30, the kernels' stage 230 -> 176 s and conformance 265 -> 188 s.  Before it, worksteal
# (an idle worker takes tests queued behind a slow one; with xdist's default load split, in big
# chunks, one worker drew the isolation selftests' hangs and ran 188 s while the others ran 45).
# GATE_SHARDS: the kernels' laws run as this many independent shards each (default 4), so
# xdist workers share one law's examples (pytest --shards).
# GATE_STAGES: the stages to run (default properties conformance perf, plus distributed on 2+ GPUs); a stage left out is reported as not run
# and refuses the gate, so only a baseline refresh ("perf" with --save-baseline) should use it.
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
DEFAULT_STAGES="properties conformance perf"
[ "$NGPU" -ge 2 ] && DEFAULT_STAGES="$DEFAULT_STAGES distributed"
[ "$NGPU" -ge 4 ] && DEFAULT_STAGES="$DEFAULT_STAGES distributed4"
STAGES=" ${GATE_STAGES:-$DEFAULT_STAGES} "
CORES=$(nproc); [ "$CORES" -gt 16 ] && CORES=16
PYTEST_ARGS=${GATE_PYTEST_ARGS:--n $CORES --dist load --maxschedchunk 1}
SHARDS=${GATE_SHARDS:-4}
RC_PROPS=-1; RC_CONF=-1; RC_PERF=-1; RC_DIST=-1; RC_DIST4=-1
T_PROPS=-; PROPS_SPLIT=""; T_CONF=-; T_PERF=-; T_DIST=-; T_DIST4=-
# Every pytest stage logs each test as it ends (outcome, seconds, Triton compiles; a
# failure's report): a run cut by a time limit still says what failed and where time went.
# Its tests run longest first (the last run's seconds; refresh: python -m perf.gate.longest_first DIRS).
PROGRESS=(-p perf.gate.progress_log -p perf.gate.longest_first)
KERNELS="triton or gluon"  # the kernels the gate exists for: their laws in the gate profile, sharded
# A Gluon mutant whose barrier waits on a phase that never comes hangs its child process:
# 40 s is past any mutant run that finishes (perf/results/2026-11-27-h200-gluon-attention/).
export SUITE_HANG_LIMIT_S=${SUITE_HANG_LIMIT_S:-40}
# One thread per worker: 16 xdist workers each running torch's default thread count on 16
# cores oversubscribe the CPU (float64 references and the oracle's comparisons run there).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
if [[ "$STAGES" == *" properties "* ]]; then
  T0=$SECONDS
  # Compile the kernels the laws will draw, once each, on every core (a fresh machine's
  # cache is empty), while the bounded laws of everything else run.
  python3 -m perf.gate.warm_triton_cache > "$OUTDIR/warm-up.log" 2>&1 &
  WARM_PID=$!
  GATE_PROGRESS="$OUTDIR/progress-rest" python3 -m pytest properties --device cuda $PYTEST_ARGS -k "not ($KERNELS)" \
    --hypothesis-profile ci -p no:cacheprovider -q "${PROGRESS[@]}" \
    --junitxml "$OUTDIR/properties-rest.xml" 2>&1 | tee "$OUTDIR/properties.log"
  RC_PROPS=${PIPESTATUS[0]}
  T_REST=$((SECONDS - T0))
  wait $WARM_PID; cat "$OUTDIR/warm-up.log" | tee -a "$OUTDIR/properties.log"
  T_WARM=$((SECONDS - T0))
  GATE_PROGRESS="$OUTDIR/progress-kernels" python3 -m pytest properties --device cuda $PYTEST_ARGS -k "$KERNELS" \
    --hypothesis-profile "$PROFILE" --shards "$SHARDS" -p no:cacheprovider -q "${PROGRESS[@]}" \
    -p conformance.margins --margins-out "$OUTDIR/margins-kernels" \
    --junitxml "$OUTDIR/properties-kernels.xml" 2>&1 | tee -a "$OUTDIR/properties.log"
  RC=${PIPESTATUS[0]}; [ $RC_PROPS -eq 0 ] && RC_PROPS=$RC
  # The Gluon flavour's laws once more with its one-launch backward off, so that its Gluon backward
  # kernels meet the small grids the laws draw (which the one-launch backward takes as shipped).
  LLM_SYSTEMS_GLUON_ONE_LAUNCH=0 GATE_PROGRESS="$OUTDIR/progress-gluon-kernels" python3 -m pytest properties \
    --device cuda $PYTEST_ARGS -k gluon --hypothesis-profile ci -p no:cacheprovider -q "${PROGRESS[@]}" \
    --junitxml "$OUTDIR/properties-gluon-kernels.xml" 2>&1 | tee -a "$OUTDIR/properties.log"
  RC=${PIPESTATUS[0]}; [ $RC_PROPS -eq 0 ] && RC_PROPS=$RC
  T_PROPS=$((SECONDS - T0))
  PROPS_SPLIT="(rest ${T_REST}s; warm-up beside it, done at ${T_WARM}s; kernels $((T_PROPS - T_WARM))s)"
fi
if [[ "$STAGES" == *" conformance "* ]]; then
  T0=$SECONDS
  GATE_PROGRESS="$OUTDIR/progress-conformance" python3 -m pytest conformance --device cuda $PYTEST_ARGS \
    --hypothesis-profile ci -p no:cacheprovider -q "${PROGRESS[@]}" --conformance-report "$OUTDIR/conformance-report" 2>&1 | tee "$OUTDIR/conformance.log"
  RC_CONF=${PIPESTATUS[0]}
  T_CONF=$((SECONDS - T0))
fi

BENCH_ARGS=(perf/gate/test_bench_gate.py --device cuda -p no:cacheprovider -q --benchmark-only
            --benchmark-storage "file://$STORAGE" --benchmark-columns=median,iqr,min,rounds
            --benchmark-json "$OUTDIR/bench.json")
T0=$SECONDS
if [[ "$STAGES" != *" perf "* ]]; then
  :
elif [ "$SAVE" -eq 1 ]; then
  python3 -m pytest "${BENCH_ARGS[@]}" --benchmark-save=baseline 2>&1 | tee "$OUTDIR/perf.log"
  RC_PERF=${PIPESTATUS[0]}
elif ls "$STORAGE"/*/*.json >/dev/null 2>&1; then
  python3 -m pytest "${BENCH_ARGS[@]}" --benchmark-compare --benchmark-compare-fail="median:${THRESHOLD}%" \
    2>&1 | tee "$OUTDIR/perf.log"
  RC_PERF=${PIPESTATUS[0]}
else
  echo "gpu gate: no baseline for $GPU in $STORAGE (run with --save-baseline on the reference commit)"
  RC_PERF=3
fi
if [[ "$STAGES" == *" perf "* ]] && [ "$SAVE" -eq 0 ]; then
  python3 -m pytest perf/gate/test_relative_gate.py --device cuda -p no:cacheprovider -q -s 2>&1 | tee -a "$OUTDIR/perf.log"
  RC=${PIPESTATUS[0]}; [ $RC_PERF -eq 0 ] && RC_PERF=$RC
fi
[[ "$STAGES" == *" perf "* ]] && T_PERF=$((SECONDS - T0))
if [[ "$STAGES" == *" distributed "* ]]; then
  T0=$SECONDS
  if [ "$NGPU" -lt 2 ]; then
    echo "gpu gate: the distributed stage needs two GPUs; $NGPU visible" | tee "$OUTDIR/distributed.log"; RC_DIST=4
  else
    DIST="properties/test_ddp.py properties/test_sharded_optimizer.py properties/test_fsdp.py properties/test_context_parallel.py
          properties/test_tensor_parallel.py properties/test_pipeline.py properties/test_ring_collectives.py
          properties/test_grad_scaler.py properties/test_sampler.py properties/test_composed.py"
    python3 -m pytest $DIST --device cuda -n 2 --hypothesis-profile ci -p no:cacheprovider -q -rs 2>&1 | tee "$OUTDIR/distributed.log"
    RC_DIST=${PIPESTATUS[0]}
  fi
  T_DIST=$((SECONDS - T0))
fi
if [[ "$STAGES" == *" distributed4 "* ]]; then
  T0=$SECONDS
  if [ "$NGPU" -lt 4 ]; then
    echo "gpu gate: the four-GPU stage needs four GPUs; $NGPU visible" | tee "$OUTDIR/distributed4.log"; RC_DIST4=4
  else
    DIST4="conformance/spec/test_ddp.py conformance/spec/test_sharded_optimizer.py conformance/spec/test_fsdp.py
           conformance/spec/test_context_parallel.py conformance/spec/test_tensor_parallel.py conformance/spec/test_pipeline.py
           conformance/spec/test_ring_collectives.py conformance/spec/test_grad_scaler.py conformance/spec/test_sampler.py
           conformance/spec/test_composed.py properties/test_composed.py"
    python3 -m pytest $DIST4 --device cuda --world-size 4 --contract-only -n 2 --hypothesis-profile ci -p no:cacheprovider \
      -q -rs 2>&1 | tee "$OUTDIR/distributed4.log"
    RC_DIST4=${PIPESTATUS[0]}
  fi
  T_DIST4=$((SECONDS - T0))
fi
for dir in "$OUTDIR"/progress-*/; do
  [ -d "$dir" ] && python3 -m perf.gate.progress_log "$dir" > "${dir%/}.txt" 2>&1
done
# this run's seconds a test, for the next run's order (copy over perf/gate/durations.json to keep them)
ls -d "$OUTDIR"/progress-*/ >/dev/null 2>&1 && python3 -m perf.gate.longest_first "$OUTDIR"/progress-*/ > "$OUTDIR/durations.json" 2>&1

echo
echo "================ GPU gate summary ($GPU) ================"
echo "properties  (kernels $PROFILE, rest ci): $(status_of $RC_PROPS) in ${T_PROPS}s ${PROPS_SPLIT}  $(last_line "$OUTDIR/properties.log")"
echo "conformance (ci):                      $(status_of $RC_CONF) in ${T_CONF}s   $(last_line "$OUTDIR/conformance.log")"
echo "perf (baseline ${THRESHOLD}% median; vs torch): $(status_of $RC_PERF) in ${T_PERF}s"
[[ "$STAGES" == *" distributed "* ]] && echo "distributed (2+ GPUs, ci):            $(status_of $RC_DIST) in ${T_DIST}s   $(last_line "$OUTDIR/distributed.log")"
[[ "$STAGES" == *" distributed4 "* ]] && echo "distributed4 (W = 4, contract, ci):   $(status_of $RC_DIST4) in ${T_DIST4}s   $(last_line "$OUTDIR/distributed4.log")"
[ -f "$OUTDIR/perf.log" ] && { grep -E "^test_gate|FAILED|Performance has regressed|median|ratio" "$OUTDIR/perf.log" | tail -n 8 || true; }
RC_DIST_GATE=0; [[ "$STAGES" == *" distributed "* ]] && RC_DIST_GATE=$RC_DIST
[[ "$STAGES" == *" distributed4 "* ]] && [ $RC_DIST_GATE -eq 0 ] && RC_DIST_GATE=$RC_DIST4
if [ $RC_PROPS -ne 0 ] || [ $RC_CONF -ne 0 ] || [ $RC_PERF -ne 0 ] || [ $RC_DIST_GATE -ne 0 ]; then
  echo "GATE: REFUSED"; exit 1
fi
echo "GATE: PASSED"
