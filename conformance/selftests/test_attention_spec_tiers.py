"""Self-checks of the attention spec's tiers (not part of any target's report)."""

import pytest
import torch

from conformance.laws.attention import spec


class _IgnoresIsCausal:
    """impl's PyTorch flavour as the handout allows a student's to be: is_causal accepted, ignored."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, q, k, v, is_causal=False):
        return self.fn.apply(q, k, v, False)


def test_the_cs336_tier_lets_the_pytorch_flavour_ignore_is_causal(device):
    from conformance.target import load_target

    attn = _IgnoresIsCausal(load_target("impl").attention("pytorch"))
    for check in spec.CS336["pytorch"]:
        check(attn, device)
    for check in (spec.is_causal_defaults_to_false, spec.cs336_causal_forward_backward):
        assert check in spec.API["pytorch"] and check in spec.CS336["triton"]
        with pytest.raises(AssertionError):
            check(attn, device)


def test_a_pytorch_flavour_ignoring_is_causal_fails_the_masking_rows_alone(device):
    """Its extras (four dims, odd lengths, ...) hold masking off and pass; the masking rows
    fail and say why.  The Triton flavour's extras still draw masking."""
    from conformance.target import load_target

    attn = _IgnoresIsCausal(load_target("impl").attention("pytorch"))
    extras = [c for c in spec.API["pytorch"] if c.__name__ in {m.__name__ for m in spec._MASKED_EXTRAS}]
    assert len(extras) == len(spec._MASKED_EXTRAS) and not set(extras) & set(spec.API["triton"])
    for check in extras:
        check(attn, device)
    with pytest.raises(AssertionError, match="is_causal is ignored"):
        spec.is_causal_defaults_to_false(attn, device)
    with pytest.raises(AssertionError, match="^causal, as in four dim inputs: forward O"):
        spec.causal_masking_in_every_extra_shape(attn, device)
    with pytest.raises(AssertionError):
        spec.four_dim_inputs(attn, device)  # the Triton flavour's row (and a mutant's rejection) masks


def test_merged_leading_dims_in_L_pass_beyond_the_contract_and_fail_within_it(device):
    """L saved as (B*H, N) for (B, H, N, d) inputs is L for the four-dim extra (its row is
    about accepting four dims), while the contract's 3-D inputs must still save (B, N)."""
    from conformance.mutants.attention import SPECS

    flattened = next(m for m in SPECS if m.name == "saves_flattened_lse").target().get_flashattention_autograd_function_pytorch()
    spec.four_dim_inputs(flattened, device)
    with pytest.raises(AssertionError, match="exactly one saved tensor"):
        spec.saves_one_logsumexp_of_query_shape(flattened, device)


def test_the_masking_row_leaves_out_shapes_that_fail_without_masking(device):
    """A flavour that masks right but refuses (N, d) and five-dim inputs fails the leading-dims
    row alone; the masking row checks the other shapes and passes."""
    from conformance.mutants.attention import SPECS

    refuses = next(m for m in SPECS if m.name == "three_or_four_dims_only").target().get_flashattention_autograd_function_pytorch()
    with pytest.raises(Exception):
        spec.other_numbers_of_leading_dims(refuses, device, masks=(False,))
    spec.causal_masking_in_every_extra_shape(refuses, device)


class _RefusesShortSequences:
    """impl's PyTorch flavour, but a shape error below 32 queries (as a tile larger than N)."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, q, k, v, is_causal=False):
        if q.shape[-2] < 32:
            raise RuntimeError("shape '[2, 32, 16]' is invalid for input of size 512")
        return self.fn.apply(q, k, v, is_causal)


def test_an_error_at_one_handout_size_names_the_size(device):
    """Not only wrong numbers: any error inside the handout-size case says at which size."""
    from conformance.target import load_target

    attn = _RefusesShortSequences(load_target("impl").attention("pytorch"))
    with pytest.raises(AssertionError, match=r"^N=16, d=16, not causal: RuntimeError: shape '\[2, 32, 16\]' is invalid"):
        spec.outputs_at_every_handout_size(attn, device)


class _RefusesUnequalLengths:
    """impl's PyTorch flavour, but a two-line error (cause last, as einops writes) when N_q != N_k."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, q, k, v, is_causal=False):
        if q.shape[-2] != k.shape[-2]:
            raise RuntimeError("Error while processing rearrange pattern\nShape mismatch, can't divide axis of length 64")
        return self.fn.apply(q, k, v, is_causal)


def test_a_crash_in_an_extra_names_its_shape_and_keeps_the_cause(device):
    """A crash (not a judged mismatch) in an extra says at which shape, and keeps the last
    line of a multi-line error, where the cause often is."""
    from conformance.target import load_target

    attn = _RefusesUnequalLengths(load_target("impl").attention("pytorch"))
    with pytest.raises(AssertionError, match=r"^batch \(2,\), N_q=64, N_k=128, d=32, float32, not causal \(forward\): "
                                             r"RuntimeError: Error while processing .* \.\.\. Shape mismatch"):
        spec.unequal_query_and_key_lengths(attn, device, masks=(False,))


def test_tf32_dots_pass_the_contract_and_fail_the_float32_extra(device):
    """A float32 kernel whose dots round to TF32 (the kept mutant ``tf32_dots``, emulated, so
    it shows on a CPU too) meets the course's contract cases and laws, and the extra names TF32."""
    from conformance.laws.attention.laws import LAWS_BY_NAME, forward_matches_float64_reference
    from conformance.laws.attention.strategies import AttentionCase
    from conformance.mutants.attention import SPECS

    tf32 = next(m for m in SPECS if m.name == "tf32_dots").target().get_flashattention_autograd_function_pytorch()
    spec.cs336_noncausal_forward_backward(tf32, device)
    spec.outputs_at_every_handout_size(tf32, device)
    spec.gradients_at_every_handout_size(tf32, device)
    cases = [AttentionCase((2,), 64, 64, 32, torch.float32, causal, None, 1.0, "contiguous", seed)
             for seed in range(4) for causal in (False, True)]  # L below the row max beyond float32's slack in some
    for law in ("contract_forward_matches_float64_reference", "contract_logsumexp_is_row_logsumexp",
                "contract_gradients_match_float64_reference"):
        for c in cases:
            LAWS_BY_NAME[law].check(tf32, c, device)
    case = cases[0]
    with pytest.raises(AssertionError, match="within the TF32 oracle"):
        spec.float32_inputs_keep_float32_accuracy(tf32, device, masks=(False,))
    with pytest.raises(AssertionError, match="exceeds the oracle bound"):
        forward_matches_float64_reference(tf32, case, device)  # the wider law: float32 accuracy


def test_a_tf32_kernel_fails_the_float32_extra_alone(device):
    """Precision is not what the other extras change: a TF32 kernel's rows there report their
    own subjects (seen on an H100: student kernels with tl.dot's default TF32 failed "many
    shapes in one process" on accuracy alone, |err| 2e-3 at N = 16)."""
    from conformance.mutants.attention import SPECS

    tf32 = next(m for m in SPECS if m.name == "tf32_dots").target().get_flashattention_autograd_function_pytorch()
    for extra in (spec.many_shapes_in_one_process, spec.four_dim_inputs, spec.noncontiguous_inputs,
                  spec.explicit_softmax_scale):
        extra(tf32, device)



def test_a_backward_not_offered_reads_not_offered_where_the_16_bit_forward_crashes():
    """The 16-bit gradient case runs the forward first; its crash is the forward row's
    failure, and the backward row says what is true of it: not offered."""
    from conformance.laws.attention import spec
    from conformance.selftests.targets.forward_float32_only import Float32ForwardOnly
    from conformance.verdicts import NotOffered

    with pytest.raises(NotOffered):
        spec.sixteen_bit_gradients_at_the_contract_shape(Float32ForwardOnly, torch.device("cpu"), dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="bfloat16"):
        spec.sixteen_bit_outputs_at_the_contract_shape(Float32ForwardOnly, torch.device("cpu"), dtype=torch.bfloat16)
