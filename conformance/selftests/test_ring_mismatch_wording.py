"""The ring collectives' mismatch check reads an error's sizes in any unit, and only sizes that differ.

``checks.names_the_offending_sizes`` decides whether a rank's error for mismatched shapes
names what is wrong.  Any wording that names a rank's shape, or (where the element counts
differ) a count of elements or bytes, passes; an error naming nothing, or naming a count
that every rank shares, does not.
"""

from __future__ import annotations

import pytest

from conformance.laws.ring_collectives.checks import names_the_offending_sizes

LONGER = ((2, 3), (2, 4))  # 6 and 8 elements
TRANSPOSED = ((2, 3), (3, 2))  # 6 elements each


@pytest.mark.parametrize("shapes, text", [
    (LONGER, "ValueError: ring_all_reduce: tensor sizes differ across the ranks of the group: [6, 8] elements"),
    (LONGER, "ValueError: shape mismatch: this rank (2, 3), another torch.Size([2, 4])"),
    (LONGER, "RuntimeError: rank 1 holds 32 B, rank 0 holds 24 B"),
    (TRANSPOSED, "ValueError: ranks disagree on shape or dtype (this rank: (2, 3) torch.float32)"),
    (TRANSPOSED, "ValueError: got a 3x2 tensor where rank 0 has 2x3"),
], ids=["elements", "shapes", "bytes", "impl-wording", "AxB"])
def test_an_error_naming_the_sizes_in_any_unit_passes(shapes, text):
    assert names_the_offending_sizes(text, shapes, element_size=4)


@pytest.mark.parametrize("shapes, text", [
    (LONGER, "ValueError: ring_all_reduce: the ranks' tensors do not agree"),
    (TRANSPOSED, "ValueError: tensor sizes differ across the ranks: 6 elements on every rank"),
    (TRANSPOSED, "TypeError: float32 tensors of bfloat16 ranks"),
], ids=["names-nothing", "a-count-all-share", "dtype-digits-are-no-sizes"])
def test_an_error_naming_nothing_that_differs_fails(shapes, text):
    assert not names_the_offending_sizes(text, shapes, element_size=4)
