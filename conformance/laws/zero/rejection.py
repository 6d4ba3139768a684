"""Running a sharded-optimizer law against a kept mutant, for a verdict only.

``rejection(law_name, target_spec, max_examples)``: the first line of the failure, or None.
Derandomised, no shrinking.  ``CONTROL`` (impl) must pass the same runs.
"""

from __future__ import annotations

import torch
from hypothesis import Phase

from conformance.harness import resolve_device
from conformance.laws.zero.laws import LAWS_BY_NAME, check_law

CONTROL = "impl"
DEFAULT_EXAMPLES = 10
SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)


def _spec_case(name: str, target_spec: str, device: torch.device) -> None:
    """``spec:<name>``: one of the fixed cases in ``conformance.laws.zero.spec``."""
    from conformance.harness import available_world_sizes
    from conformance.laws.zero.spec import SPEC_CHECKS

    check, wanted = SPEC_CHECKS[name]
    check(target_spec, min(wanted, max(available_world_sizes(device.type))), device.type)


def rejection(law_name: str, target_spec: str, max_examples: int, flavour: str = "") -> str | None:
    device = torch.device(resolve_device())
    try:
        if law_name.startswith("spec:"):
            _spec_case(law_name.removeprefix("spec:"), target_spec, device)
        else:
            check_law(LAWS_BY_NAME[law_name], target_spec, device, max_examples=max_examples, **SETTINGS)
    except AssertionError as exc:  # RankFailure and RankTimeout are AssertionErrors too
        return str(exc).splitlines()[0]
    return None
