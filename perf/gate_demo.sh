#!/usr/bin/env bash
# Shows the GPU gate passing on the real kernels and refusing two planted regressions.
#   OUT=dir bash perf/gate_demo.sh      (one GPU; about 5 minutes)
# 1. save a baseline, 2. compare the same code (pass; the two runs give the spread),
# 3. planted slow-down: forward forced to 16x16 tiles (perf/planted/slow_tiles.py) -> refused,
# 4. planted wrong result: causal mask lets each query see one future key -> refused.
# Only the attention checks run (GATE_PYTEST_ARGS) so the demonstration fits one call.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gate-demo}; mkdir -p "$OUT"
export GATE_PYTEST_ARGS=${GATE_PYTEST_ARGS:--n 8 -k test_attention}  # the attention laws and spec; not the per-config compile sweep
cp impl/flash_triton.py /tmp/flash_triton.orig.py
restore() { cp /tmp/flash_triton.orig.py impl/flash_triton.py; }
trap restore EXIT

GATE_OUT=$OUT/1-baseline bash perf/gpu_gate.sh --save-baseline --profile ci > "$OUT/1-baseline.log" 2>&1; echo "1 baseline: exit $?"
GATE_OUT=$OUT/2-real bash perf/gpu_gate.sh --profile ci > "$OUT/2-real.log" 2>&1; echo "2 real code: exit $?"
# run-to-run spread of the perf step alone: two more comparisons of the same code with the baseline
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '_'))")
for i in 1 2; do
  python3 -m pytest perf/test_bench_gate.py --device cuda -p no:cacheprovider -q --benchmark-only \
    --benchmark-storage "file://perf/baselines/$GPU" --benchmark-compare --benchmark-columns=median,iqr,min,rounds \
    > "$OUT/spread-$i.log" 2>&1; echo "spread run $i: exit $?"
done

cat perf/planted/slow_tiles.py >> impl/flash_triton.py
GATE_OUT=$OUT/3-slow bash perf/gpu_gate.sh --profile ci > "$OUT/3-slow.log" 2>&1; echo "3 planted slow-down: exit $?"
restore

before=$(grep -c 'offs_n\[None, :\] <= offs_m\[:, None\])' impl/flash_triton.py)
sed -i 's/offs_n\[None, :\] <= offs_m\[:, None\])/offs_n[None, :] <= offs_m[:, None] + 1)/' impl/flash_triton.py
echo "planted wrong result: $before causal mask comparisons changed"
GATE_OUT=$OUT/4-wrong bash perf/gpu_gate.sh --profile ci > "$OUT/4-wrong.log" 2>&1; echo "4 planted wrong result: exit $?"
restore

{ for f in 1-baseline 2-real 3-slow 4-wrong; do echo "== $f"; sed -n '/GPU gate summary/,$p' "$OUT/$f.log"; done
  for i in 1 2; do echo "== spread run $i (same code vs baseline)"; grep -E "test_gate|Name" "$OUT/spread-$i.log"; done; } | tee "$OUT/summary.txt"
cp -r perf/baselines "$OUT/baselines" 2>/dev/null; tar czf "$OUT/gate-demo-logs.tgz" -C "$OUT" . 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name gate-demo-logs.tgz ! -name '*.log' -exec rm -rf {} +
