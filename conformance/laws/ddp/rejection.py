"""Running a data-parallel law (or spec case) against a kept mutant, for a verdict only.

``rejection(law_name, target_spec, max_examples, flavour)``: the first line of the failure,
or None.  World sizes >= 2 (most bugs are invisible on one rank), derandomised, no
shrinking.  ``CONTROL`` (impl) must pass the same runs
"""

from __future__ import annotations

from hypothesis import Phase, given, settings
from hypothesis.errors import FlakyFailure

from conformance.laws.ddp import spec as ddp_spec
from conformance.laws.ddp.laws import LAWS_BY_NAME

CONTROL = "impl"
DEFAULT_EXAMPLES = 12
SETTINGS = dict(phases=[Phase.explicit, Phase.generate], database=None, derandomize=True, report_multiple_bugs=False)


def rejection(law_name: str, target_spec: str, max_examples: int, flavour: str = "ddp2026") -> str | None:
    try:
        if law_name.startswith("spec:"):
            for bucket_size_mb in ddp_spec.BUCKET_SIZES_MB[flavour]:
                ddp_spec.run_case(law_name.removeprefix("spec:"), target_spec, flavour, bucket_size_mb)
            return None
        law = LAWS_BY_NAME[law_name]

        @settings(max_examples=max_examples, **SETTINGS)
        @given(case=law.cases(min_world=2))
        def run(case):
            law.check(target_spec, flavour, case)

        run()
    except AssertionError as exc:  # includes RankFailure and RankTimeout
        return str(exc).strip().splitlines()[0]
    except FlakyFailure as exc:  # failed on its first call, passed on replay: still a rejection
        return "flaky rejection: " + str(exc.exceptions[0]).strip().splitlines()[0]
    return None
