#!/usr/bin/env bash
# All benchmarks in one GPU call (<= ~8 minutes on one H100); files land in $OUT.
#
#   bash perf/scripts/run_gpu_benchmarks.sh [--budget-s 450] [--tiny]
#
# See perf/bench/run_gpu.py for the stages and the eight files it writes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
exec python3 -m perf.bench.run_gpu --out "${OUT:-perf-out}" "$@"
