#!/usr/bin/env bash
# The GPU gate: refuses a kernel change that is wrong or slower.
#
#   bash perf/gate/gpu_gate.sh [--save-baseline] [--profile thorough] [--threshold PCT]
#
# 1. properties on CUDA with the thorough profile (bf16 included; a test asserts bf16 is drawn)
# 2. conformance on CUDA, with the report written to $GATE_OUT (default gate-out/)
# 3. perf/gate/test_bench_gate.py compared with the stored baseline for this GPU model,
#    failing on a median regression over the threshold (default 8%: see perf/gate/GATE.md for
#    the measured run-to-run spread it is set from)
# Exits non-zero on any failure or regression, and prints a short summary last.
set -u
cd "$(dirname "$0")/../.."

PROFILE=thorough
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

# GATE_PYTEST_ARGS: extra pytest arguments for the properties and conformance runs (e.g. "-n 8").
# GATE_STAGES: the stages to run (default all three); a stage left out is reported as not run
# and refuses the gate, so only a baseline refresh ("perf" with --save-baseline) should use it.
STAGES=" ${GATE_STAGES:-properties conformance perf} "
RC_PROPS=-1; RC_CONF=-1; RC_PERF=-1
if [[ "$STAGES" == *" properties "* ]]; then
  python3 -m pytest properties --device cuda ${GATE_PYTEST_ARGS:-} --hypothesis-profile "$PROFILE" -p no:cacheprovider -q \
    --junitxml "$OUTDIR/properties.xml" 2>&1 | tee "$OUTDIR/properties.log"
  RC_PROPS=${PIPESTATUS[0]}
fi
if [[ "$STAGES" == *" conformance "* ]]; then
  python3 -m pytest conformance --device cuda ${GATE_PYTEST_ARGS:-} --hypothesis-profile "$PROFILE" -p no:cacheprovider -q \
    --conformance-report "$OUTDIR/conformance-report" 2>&1 | tee "$OUTDIR/conformance.log"
  RC_CONF=${PIPESTATUS[0]}
fi

BENCH_ARGS=(perf/gate/test_bench_gate.py --device cuda -p no:cacheprovider -q --benchmark-only
            --benchmark-storage "file://$STORAGE" --benchmark-columns=median,iqr,min,rounds
            --benchmark-json "$OUTDIR/bench.json")
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

echo
echo "================ GPU gate summary ($GPU) ================"
echo "properties  ($PROFILE, cuda): $(status_of $RC_PROPS)   $(last_line "$OUTDIR/properties.log")"
echo "conformance (cuda):           $(status_of $RC_CONF)   $(last_line "$OUTDIR/conformance.log")"
echo "perf vs baseline (${THRESHOLD}% median): $(status_of $RC_PERF)"
[ -f "$OUTDIR/perf.log" ] && { grep -E "^test_gate|FAILED|Performance has regressed|median" "$OUTDIR/perf.log" | tail -n 6 || true; }
if [ $RC_PROPS -ne 0 ] || [ $RC_CONF -ne 0 ] || [ $RC_PERF -ne 0 ]; then
  echo "GATE: REFUSED"; exit 1
fi
echo "GATE: PASSED"
