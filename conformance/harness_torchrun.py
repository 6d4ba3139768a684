"""Run one harness case under ``torchrun`` (one host or many) instead of the local pool.

    torchrun --standalone --nproc-per-node 2 -m conformance.harness_torchrun \\
        MODULE:FN ['[json args]'] ['{json kwargs}'] [--device cpu|cuda] [--timeout S] \\
        [--expect-equal] [--json-out PATH]

Each process builds the same ``RankContext`` the pool gives (rank, world size, device,
backend), initialises the default process group from torchrun's environment
(``env://``; NCCL with ``cuda:$LOCAL_RANK`` on GPUs, gloo on the CPU), calls
``FN(ctx, *args, **kwargs)`` once, and rank 0 gathers every rank's result with
``all_gather_object`` and prints one line ``RESULTS <json>`` (tensors become nested
lists).  ``--expect-equal`` exits with status 1 unless every rank returned the same
result (tensors compared bitwise), the DDP replica law.  Exceptions propagate, so
torchrun reports the failing rank and stops the others.

When every process runs on this host (``LOCAL_WORLD_SIZE == WORLD_SIZE``), gloo and NCCL
bootstrap sockets are pinned to the loopback interface, as in the pool.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from conformance.harness import RankContext, _loopback_interface, _results_to_cpu, resolve_device


def load_case(spec: str):
    if ":" not in spec:
        raise ValueError(f"case must be MODULE:FN, got {spec!r}")
    module_name, fn_name = spec.split(":", 1)
    fn = getattr(importlib.import_module(module_name), fn_name, None)
    if not callable(fn):
        raise ValueError(f"{module_name} has no function {fn_name!r}")
    return fn


def to_json(obj):
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def same(a, b) -> bool:
    """Structural equality with tensors compared bitwise (dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.harness_torchrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("case", help="MODULE:FN, a module-level case function fn(ctx, *args, **kwargs)")
    parser.add_argument("args", nargs="?", default="[]", help="JSON list of positional arguments")
    parser.add_argument("kwargs", nargs="?", default="{}", help="JSON object of keyword arguments")
    parser.add_argument("--device", default=None, choices=("auto", "cpu", "cuda"), help="default: $SUITE_DEVICE or auto")
    parser.add_argument("--timeout", type=float, default=600.0, help="collective timeout in seconds")
    parser.add_argument("--expect-equal", action="store_true", help="fail unless every rank returns the same result")
    parser.add_argument("--json-out", default=None, help="rank 0 also writes the results here")
    opts = parser.parse_args(argv)

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        parser.error("run me under torchrun (RANK and WORLD_SIZE are not set)")
    args = json.loads(opts.args)
    kwargs = json.loads(opts.kwargs)
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        parser.error("args must be a JSON list and kwargs a JSON object")
    fn = load_case(opts.case)

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if int(os.environ.get("LOCAL_WORLD_SIZE", -1)) == world_size:
        loopback = _loopback_interface()
        if loopback:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    device_kind = resolve_device(opts.device)
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=opts.timeout))
    try:
        ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
        result = _results_to_cpu(fn(ctx, *args, **kwargs))
        gathered = [None] * world_size
        dist.all_gather_object(gathered, result)
    finally:
        dist.destroy_process_group()

    status = 0
    if rank == 0:
        print("RESULTS " + json.dumps(to_json(gathered)), flush=True)
        if opts.json_out:
            with open(opts.json_out, "w") as f:
                json.dump(to_json(gathered), f)
        if opts.expect_equal:
            differing = [r for r in range(1, world_size) if not same(gathered[0], gathered[r])]
            if differing:
                print(f"ranks {differing} returned results different from rank 0's", file=sys.stderr)
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
