"""torch's ZeroRedundancyOptimizer as a target: the known-good sharded optimizer.

``--target conformance.adapters.torch_zero`` checks it with the sharded-optimizer laws.
It follows torch's own state-dict protocol: ``consolidate_state_dict(to)`` on every rank,
then ``state_dict()`` on rank ``to`` returns the full state; ``state_dict()`` alone is not
a per-rank state, so the per-rank round-trip law reports it "not offered" (see
``conformance.laws.zero.laws.per_rank_state_dict``).  ``load_state_dict`` takes the
full state at any world size.
"""

from __future__ import annotations

import torch

# Spec cases that do not hold for it (conformance/spec/test_sharded_optimizer.py runs them
# as strict expected failures, so a fix upstream shows up).
KNOWN_DEVIATIONS = {
    "unsupported_device_is_a_clear_error": (
        "parameters on a device the backend cannot communicate are not rejected with a ValueError/TypeError: "
        "with gloo, meta-device parameters are accepted and stepped silently"
    ),
}


NOTE = (
    "load_state_dict is patched here: torch's ZeroRedundancyOptimizer moves every 0-dim state "
    "tensor to the CPU on load (meant for Adam's 'step'), so a 0-dim parameter's exp_avg lands "
    "on the CPU and the next step on CUDA fails with 'found at least two devices'; the patch "
    "puts the state of 0-dim parameters other than 'step' back on the parameter's device"
)


def _scalar_state_back_on_device(zero) -> None:
    """Undo the upstream move to the CPU for the per-element state of 0-dim parameters.

    Found by the law ``consolidated_state_dict_resumes_at_any_world_size`` on CUDA (NCCL),
    minimal case: one parameter of shape (), Adam, save after one step, resume at world
    size 1.  On the CPU every tensor lives on the CPU already, so gloo never shows it."""
    for param, state in zero.optim.state.items():
        if param.dim() != 0:
            continue
        for name, value in state.items():
            if name != "step" and torch.is_tensor(value) and value.device != param.device:
                state[name] = value.to(param.device)


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    class PatchedZeroRedundancyOptimizer(ZeroRedundancyOptimizer):
        def load_state_dict(self, state_dict) -> None:
            super().load_state_dict(state_dict)
            _scalar_state_back_on_device(self)

    return PatchedZeroRedundancyOptimizer(params, optimizer_class=optimizer_cls, **kwargs)
