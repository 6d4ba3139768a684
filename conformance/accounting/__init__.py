"""Accounting: what a training step costs, as formulas checked against measurement.

    memory          per-rank bytes of parameters, gradients, optimizer state, activations
                    (DDP, ZeRO-1/2/3) and the tools that measure them
    flops           model FLOPs per token (6N plus the attention term) and MFU
    communication   per-step collectives and bytes of DDP, ZeRO-1/2/3, TP, PP and context
                    parallelism, and the ring time model

The formulas are checked in ``conformance/selftests/test_accounting.py`` against what the
implementations allocate, what torch's FLOP counter counts and what the collectives carry;
``perf/bench/accounting.py`` checks them on the GPU (CUDA peaks, measured MFU).
"""

from .memory import *  # noqa: F401,F403  (the measuring tools and memory formulas, as before)
from .memory import _storage_bytes  # noqa: F401
