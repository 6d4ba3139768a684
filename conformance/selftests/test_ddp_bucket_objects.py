"""The bucket-layout law reads ``.buckets`` as lists of parameter names, indices or
parameters; buckets of another shape are "not offered: bucket layout", not a crash.

CS336 defines no bucket introspection, so a wrapper whose ``.buckets`` holds its own
bucket objects has not got the layout wrong; one whose lists hold the parameters
themselves is read by name.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from conformance.verdicts import NotOffered
from conformance.laws.ddp import laws
from conformance.laws.ddp.model import ModelSpec

pytestmark = pytest.mark.distributed

TARGET = """
    import torch.nn as nn


    class _Bucket:
        def __init__(self, params):
            self.params = params


    class Wrapper(nn.Module):
        def __init__(self, module, buckets):
            super().__init__()
            self.module = module
            self.buckets = buckets

        def forward(self, *args):
            return self.module(*args)


    def get_ddp_bucketed(module, bucket_size_mb):
        per_param = [[p] for p in reversed(list(module.parameters()))]
        return Wrapper(module, {SHAPE})


    def ddp_bucketed_on_after_backward(model, optimizer):
        pass
"""

CASE = (ModelSpec(2, (3,), 2), 1e-6, 1, 0)  # one parameter per bucket, one rank


def _target(tmp_path, name, shape):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(TARGET).replace("{SHAPE}", shape))
    return str(path)


def test_bucket_objects_of_another_shape_are_not_offered(tmp_path):
    spec = _target(tmp_path, "bucket_objects", "[_Bucket(b) for b in per_param]")
    with pytest.raises(NotOffered, match="bucket layout: .*holds _Bucket objects"):
        laws.law_buckets_partition_in_reverse_order(spec, "bucketed", CASE)


def test_lists_of_parameters_are_read_by_name_and_checked(tmp_path):
    right, wrong = _target(tmp_path, "param_lists", "per_param"), _target(tmp_path, "reversed_lists", "per_param[::-1]")

    @settings(max_examples=1, database=None, deadline=None)
    @given(st.just(CASE))  # the law notes what it saw, which needs a Hypothesis test around it
    def check(case):
        laws.law_buckets_partition_in_reverse_order(right, "bucketed", case)
        with pytest.raises(AssertionError, match="reverse registration order"):
            laws.law_buckets_partition_in_reverse_order(wrong, "bucketed", case)

    check()
