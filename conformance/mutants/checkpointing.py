"""Deliberately broken checkpointed stacks: the suite must reject every one.

Each mutant is a target (``--target conformance.mutants.checkpointing:rng_not_restored``)
offering ``get_checkpointed_blocks`` built on ``impl.checkpointing`` with one decision
changed, and names the laws (``conformance.laws.checkpointing.laws``) that must reject it;
``conformance/selftests/test_mutants.py`` checks that they do.  A bug that costs the user
memory or recomputation is rejected by a contract bound; a plan that only departs from the
reference one (checkpointing more than asked, a k one short where that holds less) is
rejected by the exact extras alone, as a correct design's departures are.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

from torch.utils.checkpoint import checkpoint

from conformance.lawbook import Mutant
from impl.checkpointing import CheckpointedBlocks, Region, _carried, _segments, plan

CAPABILITY = "activation checkpointing"


class _Stack(CheckpointedBlocks):
    """impl's stack with switches; every switch off is impl."""

    preserve_rng = True
    keep_inner_inputs = False
    twice_below_top = False
    reentrant = False
    skip_without_grad = False

    def forward(self, x):
        self._kept = []
        return self._run(self.plan, x)

    def _run(self, body, x, depth=0):
        out = x
        for j, item in enumerate(body):
            inp = _carried(out) if j else out
            if isinstance(item, Region):
                out = self._region(item, inp, depth)
            else:
                if self.keep_inner_inputs and depth > 0:
                    self._kept.append(inp)  # held until the next forward: a region input per block
                out = self.blocks[item](inp)
        return out

    def _region(self, region, inp, depth):
        def body(t):
            if self.twice_below_top and depth > 0:
                self._run(region.body, t, depth + 1)  # the level's body once too often
            return self._run(region.body, t, depth + 1)

        if self.skip_without_grad and not getattr(inp, "requires_grad", False):
            return body(inp)  # no input gradient wanted, so (wrongly) nothing to save: runs unchecked
        if self.reentrant:
            return checkpoint(body, inp, use_reentrant=True, preserve_rng_state=self.preserve_rng)
        return checkpoint(body, inp, use_reentrant=False, early_stop=False, preserve_rng_state=self.preserve_rng)


def _target(cls=_Stack, plan_fn=None, copy_blocks=False, lenient=False):
    def get_checkpointed_blocks(blocks, strategy, segment_size=None):
        blocks = list(blocks)
        if copy_blocks:
            blocks = [copy.deepcopy(b) for b in blocks]
        if lenient:
            strategy = strategy if strategy in ("none", "every", "segments", "sqrt", "nested") else "every"
            if strategy == "segments":
                segment_size = min(max(int(segment_size or 1), 1), len(blocks))
        stack = cls(blocks, strategy, segment_size)
        if plan_fn is not None:
            stack.plan = plan_fn(len(blocks), strategy, segment_size, stack.plan)
        return stack

    return SimpleNamespace(get_checkpointed_blocks=get_checkpointed_blocks)


def _switch(**flags):
    return type("Mutated", (_Stack,), flags)


def _sqrt_one_short_at_squares(n, strategy, k, good):
    """The best single level from isqrt(N - 1), without the + 1: one too small at N = 4, 9, 16."""
    if strategy != "sqrt" or n < 2:
        return good
    return _segments(n, max(1, math.isqrt(n - 1)))


def _every_block_for_segments(n, strategy, k, good):
    """"segments" and "sqrt" checkpoint every block alone: the same 2N forwards, a lower peak,
    and not the plan asked for (each region input kept)."""
    return _segments(n, 1) if strategy in ("segments", "sqrt") else good


def _nothing_checkpointed(n, strategy, k, good):
    """Every strategy runs the blocks plainly: every block's activations kept."""
    return tuple(range(n))


def _last_block_left_out(n, strategy, k, good):
    """Each single-level region ends one block early; that block runs plainly after it."""
    if strategy not in ("every", "segments", "sqrt"):
        return good
    out = []
    for region in good:
        *inner, last = region.body
        if inner:
            out.append(Region(tuple(inner)))
        out.append(last)
    return tuple(out)


rng_not_restored = _target(_switch(preserve_rng=False))
inner_blocks_save_inputs = _target(_switch(keep_inner_inputs=True))
segment_boundary_off_by_one = _target(plan_fn=_last_block_left_out)
nested_level_recomputes_twice = _target(_switch(twice_below_top=True))
reentrant_checkpoint = _target(_switch(reentrant=True))
blocks_copied = _target(copy_blocks=True)
bad_requests_accepted = _target(lenient=True)
unchecked_when_the_input_needs_no_grad = _target(_switch(skip_without_grad=True))
sqrt_one_short_at_squares = _target(plan_fn=_sqrt_one_short_at_squares)
segments_checkpoint_every_block = _target(plan_fn=_every_block_for_segments)
no_checkpointing = _target(plan_fn=_nothing_checkpointed)

_M = "conformance.mutants.checkpointing:"
MUTANTS = (
    Mutant("rng_not_restored", CAPABILITY, "the RNG state is not restored before recomputation (dropout redraws)",
           ("gradients_and_loss_equal_no_checkpointing_bit_for_bit",), _M + "rng_not_restored"),
    Mutant("inner_blocks_save_inputs", CAPABILITY, "every inner block of a region still keeps its input",
           ("activation_peak_is_at_most_the_bound",), _M + "inner_blocks_save_inputs"),
    Mutant("segment_boundary_off_by_one", CAPABILITY,
           "each segment ends one block early, leaving its last block unchecked",
           ("activation_peak_is_at_most_the_bound", "block_forwards_equal_the_reference_plans"),
           _M + "segment_boundary_off_by_one"),
    Mutant("nested_level_recomputes_twice", CAPABILITY, "a nested level runs its region's body twice",
           ("block_forwards_are_at_most_the_bound",), _M + "nested_level_recomputes_twice"),
    Mutant("no_checkpointing", CAPABILITY, "every strategy runs the blocks plainly, nothing checkpointed",
           ("activation_peak_is_at_most_the_bound",), _M + "no_checkpointing"),
    Mutant("segments_checkpoint_every_block", CAPABILITY,
           "'segments' and 'sqrt' checkpoint every block alone (a lower peak, the same forwards)",
           ("activation_peak_equals_the_reference_plans",), _M + "segments_checkpoint_every_block"),
    Mutant("reentrant_checkpoint", CAPABILITY,
           "reentrant checkpointing: no parameter gradients when no input requires grad",
           ("input_without_grad_still_gives_parameter_gradients",), _M + "reentrant_checkpoint"),
    Mutant("blocks_copied", CAPABILITY, "the stack runs deep copies of the blocks (parameters and buffers not theirs)",
           ("gradients_and_loss_equal_no_checkpointing_bit_for_bit",
            "blocks_with_buffers_and_non_tensor_outputs_match_the_plain_stack"), _M + "blocks_copied"),
    Mutant("unchecked_when_the_input_needs_no_grad", CAPABILITY,
           "a region whose input does not require grad runs without checkpointing (its activations all kept)",
           ("input_without_grad_still_gives_parameter_gradients",), _M + "unchecked_when_the_input_needs_no_grad"),
    Mutant("sqrt_one_short_at_squares", CAPABILITY,
           "the sqrt strategy's k is one too small where N is a perfect square (isqrt(N - 1) without the + 1)",
           ("spec:exact_peak_at_perfect_squares",), _M + "sqrt_one_short_at_squares"),
    Mutant("bad_requests_accepted", CAPABILITY, "an unknown strategy or k outside 1..N is silently replaced",
           ("bad_strategy_or_segment_size_is_a_clear_error",), _M + "bad_requests_accepted"),
)
