#!/usr/bin/env bash
# Shows the GPU gate passing on the real kernels and refusing two planted regressions.
#   OUT=dir bash perf/gate/gate_demo.sh      (one GPU; about 8 minutes on a fresh machine)
# 1. save a perf baseline, 2. three comparisons of the same code (the run-to-run spread),
# 3. the whole gate on the real code (pass),
# 4. planted slow-down: forward forced to 16x16 tiles (perf/gate/planted/slow_tiles.py): the perf
#    stage refuses it (its properties and conformance pass: the tiles are slow, not wrong),
#    4b. planted host-path regression: no launch plans (perf/gate/planted/no_launch_plans.py):
#    the relative checks (ours against torch beside it) refuse it,
# 5. planted wrong result: the causal mask lets each query see one future key: the whole gate refuses.
# Only the attention checks run (GATE_PYTEST_ARGS) so the demonstration fits one call.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-gate-demo}; mkdir -p "$OUT"
export GATE_PYTEST_ARGS=${GATE_PYTEST_ARGS:--n 8 -k test_attention}  # the attention laws and spec; not the per-config compile sweep
cp impl/attention/flash_triton.py /tmp/flash_triton.orig.py
restore() { cp /tmp/flash_triton.orig.py impl/attention/flash_triton.py; }
trap restore EXIT
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '_'))")
rm -rf "perf/gate/baselines/$GPU"

GATE_STAGES=perf GATE_OUT=$OUT/1-baseline bash perf/gate/gpu_gate.sh --save-baseline > "$OUT/1-baseline.log" 2>&1; echo "1 baseline saved: exit $?"
for i in 1 2 3; do
  python3 -m pytest perf/gate/test_bench_gate.py --device cuda -p no:cacheprovider -q --benchmark-only \
    --benchmark-storage "file://perf/gate/baselines/$GPU" --benchmark-compare --benchmark-columns=median,iqr,min,rounds \
    > "$OUT/2-spread-$i.log" 2>&1; echo "2 spread run $i: exit $?"
done
GATE_OUT=$OUT/3-real bash perf/gate/gpu_gate.sh --profile ci > "$OUT/3-real.log" 2>&1; echo "3 real code, whole gate: exit $?"

cat perf/gate/planted/slow_tiles.py >> impl/attention/flash_triton.py
GATE_STAGES=perf GATE_OUT=$OUT/4-slow bash perf/gate/gpu_gate.sh > "$OUT/4-slow.log" 2>&1; echo "4 planted slow-down, perf stage: exit $?"
restore

cat perf/gate/planted/no_launch_plans.py >> impl/attention/flash_triton.py
GATE_STAGES=perf GATE_OUT=$OUT/4b-host bash perf/gate/gpu_gate.sh > "$OUT/4b-host.log" 2>&1; echo "4b planted host-path regression (no launch plans), perf stage: exit $?"
restore

before=$(grep -c 'offs_n\[None, :\] <= offs_m\[:, None\])' impl/attention/flash_triton.py)
sed -i 's/offs_n\[None, :\] <= offs_m\[:, None\])/offs_n[None, :] <= offs_m[:, None] + 1)/' impl/attention/flash_triton.py
echo "planted wrong result: $before causal mask comparisons changed"
GATE_OUT=$OUT/5-wrong bash perf/gate/gpu_gate.sh --profile ci > "$OUT/5-wrong.log" 2>&1; echo "5 planted wrong result, whole gate: exit $?"
restore

{ for f in 1-baseline 3-real 4-slow 4b-host 5-wrong; do echo "== $f"; sed -n '/GPU gate summary/,$p' "$OUT/$f.log"; done
  for i in 1 2 3; do echo "== spread run $i (same code vs baseline)"; grep -E "test_gate|Name" "$OUT/2-spread-$i.log"; done; } | tee "$OUT/summary.txt"
cp -r perf/gate/baselines "$OUT/baselines"
tar czf /tmp/gate-demo.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/gate-demo.tgz "$OUT/" && cp /dev/null /dev/null
