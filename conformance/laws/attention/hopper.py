"""Where the Gluon flavour can run: a Hopper GPU (compute capability 9.x) and a Triton
with Gluon's Hopper modules.  Anywhere else its checks read "not run here" with the reason,
never passed and never failed."""

from __future__ import annotations

import torch

from conformance.verdicts import EnvironmentRefusal

GLUON_HEAD_DIMS = (64, 128)  # what the flavour's contract offers (impl/attention/flash_gluon.py)
GLUON_DTYPES = (torch.float16, torch.bfloat16)


def gluon_not_run_reason(device) -> str | None:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return (f"the Gluon flavour needs a Hopper GPU (compute capability 9.x); these checks run on {device.type}"
                + ("" if torch.cuda.is_available() else " and this machine has no CUDA device"))
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if major != 9:
        return (f"the Gluon flavour needs a Hopper GPU (compute capability 9.x); cuda:{index} is "
                f"{torch.cuda.get_device_name(index)} ({major}.{minor})")
    try:
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
    except ImportError as exc:
        return f"this Triton has no Gluon Hopper modules ({exc})"
    return None


def refuse_gluon_here(device) -> None:
    """Raise the "not run here" verdict where the Gluon flavour cannot run."""
    reason = gluon_not_run_reason(device)
    if reason:
        raise EnvironmentRefusal(reason)
