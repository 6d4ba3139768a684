"""Data-parallel spec cases (``conformance/laws/ddp/spec.py``) against ``--target``, per flavour.

(That torch's DistributedDataParallel passes every case, and that this project's own
wrappers state their bad-input errors, are self-checks: ``conformance/selftests``.)
"""

from __future__ import annotations

import pytest

from conformance.laws.ddp import spec as ddp_spec
from conformance.laws.ddp.flavours import FLAVOURS

pytestmark = pytest.mark.distributed

BUCKET_SIZES_MB = ddp_spec.BUCKET_SIZES_MB


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    return request.param


@pytest.mark.parametrize("case", ddp_spec.CONTRACT_CASES)
def test_contract_case(case, flavour, target):
    """The course's own check: the toy models trained on two ranks match one process;
    rank 0's state is broadcast at wrap and the two replicas stay bit-identical.  The
    sources of each pinned quantity: ``conformance.laws.ddp.spec.check_toy_training``.
    The bucketed flavour runs at 1e-4 MB, 100 MB and None ("a single bucket of unbounded
    size", the course adapter's docstring)."""
    for bucket_size_mb in BUCKET_SIZES_MB[flavour]:
        ddp_spec.run_case(case, target.spec, flavour, bucket_size_mb)


@pytest.mark.parametrize("case", [c for c in ddp_spec.CASES if c not in ddp_spec.CONTRACT_CASES])
def test_api_case(case, flavour, target):
    # None (one unbounded bucket) is the contract cases' to check; here it would repeat 100 MB
    for bucket_size_mb in [b for b in BUCKET_SIZES_MB[flavour] if b is not None or flavour != "bucketed"]:
        ddp_spec.run_case(case, target.spec, flavour, bucket_size_mb)
