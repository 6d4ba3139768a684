#!/usr/bin/env bash
# The composed-parallelism check launched as two "nodes" with torchrun on one machine:
# two separate `torchrun --nnodes 2` launches meeting at a c10d rendezvous on 127.0.0.1,
# each with NPROC ranks (gloo on the CPU).  On a real cluster run the same torchrun line on
# every host with its own --node-rank and the first host's address as --rdzv-endpoint
# (conformance/CLUSTER.md).
#
#   perf/scripts/torchrun_two_nodes.sh [OUT_DIR] [NPROC]
#
# Case: DP x TP, dp = 2 across the two nodes, tp = 2 inside each (tp innermost: its ranks
# are neighbours, i.e. on one node).  Each rank checks its gathered loss, gradients and
# parameters against one process on the whole batch (conformance.oracle); rank 0 prints
# every rank's summary (RESULTS <json>).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-perf/results/2026-11-23-cpu-torchrun-two-nodes}
NPROC=${2:-2}
mkdir -p "$OUT"
PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ARGS='["impl", {"sizes": [["dp", 2], ["tp", 2]], "data_parallel": "ddp", "n_layers": 2, "n_heads": 2, "head_dim": 4, "d_ff": 8, "vocab_size": 11, "batch": 4, "seq": 4, "n_microbatches": 1, "ignore_fraction": 0.0, "seed": 7}]'
launch() {  # $1 = node rank
  torchrun --nnodes 2 --nproc-per-node "$NPROC" --node-rank "$1" \
    --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id composed-two-nodes \
    -m conformance.harness_torchrun conformance.laws.composed.rank:checked_step_on_rank \
    "$ARGS" --device cpu --timeout 120 --json-out "$OUT/results.json"
}
{
  echo "# $(date -u +%FT%TZ)  torch $(python -c 'import torch; print(torch.__version__)')  two launches x $NPROC ranks, c10d rendezvous 127.0.0.1:$PORT"
} > "$OUT/run.log"
launch 0 > "$OUT/node0.log" 2>&1 &
N0=$!
launch 1 > "$OUT/node1.log" 2>&1 &
N1=$!
rc0=0; rc1=0
wait $N0 || rc0=$?
wait $N1 || rc1=$?
echo "node 0 exit $rc0, node 1 exit $rc1" | tee -a "$OUT/run.log"
grep -h "^RESULTS" "$OUT"/node*.log | tee -a "$OUT/run.log" >/dev/null || true
[ "$rc0" = 0 ] && [ "$rc1" = 0 ]
