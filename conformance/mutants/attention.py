"""Deliberately broken FlashAttention implementations: the suite must reject every one.

Each mutant is a target (``conformance.mutants.attention:MUTANTS['name']`` or
``--target conformance.mutants.attention:no_rescale``) whose PyTorch flavour carries one
classic bug, and names the laws that exist to catch it.  They share one small tiled
implementation, ``BuggyFlash``, whose bug switches are off in the correct setting; it is
written for clarity of the bugs, not for speed.

The backward materialises P from the saved L (fine for a mutant: it is the tiling of the
forward that the forward bugs live in, and the saved L that backward bugs depend on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from conformance.lawbook import Mutant
from impl.attention.validation import validate_attention_inputs

TILE = 16


_CAUSAL_BY_LENGTHS: dict = {}  # causal_flag_cached_by_lengths: the first flag seen per (N_q, N_k)
_OUTPUT_BUFFERS: dict = {}  # output_buffer_reused: one O buffer per (shape, dtype), handed out every call
_BY_ADDRESS: dict = {}  # output_memoised_by_address: (O, L) per (addresses, shapes, strides, dtype, flags)


_SHAPES_COMPILED: set = set()  # compiled_per_shape_with_a_limit: the shapes "compiled" so far
COMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit's default


def _mm(a, b, bugs, dtype):
    """a @ b; with tf32_dots and float32 inputs, both operands rounded to TF32 first, as a
    float32 tl.dot does by default on NVIDIA GPUs."""
    if "tf32_dots" in bugs and dtype == torch.float32:
        from conformance.laws.attention.tf32 import round_to_tf32

        a, b = round_to_tf32(a), round_to_tf32(b)
    return a @ b


def _forward(q, k, v, is_causal, scale, bugs):
    if "compiled_per_shape_with_a_limit" in bugs:  # as torch.compile(dynamic=False, fullgraph=True)
        _SHAPES_COMPILED.add((q.shape, q.dtype, bool(is_causal)))
        if len(_SHAPES_COMPILED) > COMPILE_LIMIT:
            raise RuntimeError(f"recompile limit ({COMPILE_LIMIT}) exceeded: a new shape after {COMPILE_LIMIT} compiled ones")
    if "causal_flag_cached_by_lengths" in bugs:  # as a mask cached by sequence lengths alone would
        is_causal = _CAUSAL_BY_LENGTHS.setdefault((q.shape[-2], k.shape[-2], q.device), is_causal)
    if "float32_inputs_only" in bugs and q.dtype in (torch.float16, torch.bfloat16):
        # as P kept in float32 multiplying a bf16 V tile does
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: float != {q.dtype}")
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    acc_dtype = torch.float16 if "fp16_accumulators" in bugs else work
    if "input_precision_accumulators" in bugs:
        acc_dtype = q.dtype  # O and l summed in bf16 when the inputs are bf16
    if scale is None:
        scale = 1.0 / q.shape[-1] if "scale_one_over_d" in bugs else 1.0 / math.sqrt(q.shape[-1])
    qf, kf, vf = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    if "batch_mixing" in bugs:
        kf = kf[:1].expand_as(kf)  # every batch element attends to element 0's keys
    batch, n_q, d = qf.shape
    n_k = kf.shape[1]
    o = torch.empty(batch, n_q, d, dtype=torch.float32 if "output_in_float32" in bugs else q.dtype, device=q.device)
    if "output_buffer_reused" in bugs:
        o = _OUTPUT_BUFFERS.setdefault((o.shape, o.dtype, o.device), o)
    lse = torch.empty(batch, n_q, dtype=work, device=q.device)
    if "keys_padded_to_64_unmasked" in bugs and n_k % 64:
        # a 64-key tile read past N with zeros filling the rest, and no mask: the padded keys
        # score 0 and take softmax weight wherever N is not a multiple of 64
        pad = 64 - n_k % 64
        kf = torch.cat([kf, kf.new_zeros(kf.shape[0], pad, kf.shape[-1])], dim=1)
        vf = torch.cat([vf, vf.new_zeros(vf.shape[0], pad, vf.shape[-1])], dim=1)
        n_k = kf.shape[1]
    key_end = n_k - n_k % TILE if ("drop_partial_tile" in bugs and n_k > TILE) else n_k
    # Sequences in the thousands (the long bf16 contract law) in 32-row tiles: 16-row tiles
    # cost 16k Python steps at N = 2048 (75 s for input_precision_accumulators, now 10 s);
    # its 64 bf16 accumulation steps still miss the oracle by 2x (1.04e-2 against 5.1e-3;
    # 32 steps, with 64-row tiles, stay inside it)
    tile = 32 if n_k >= 1024 else TILE
    for qs in range(0, n_q, tile):
        qe = min(qs + tile, n_q)
        q_i = qf[:, qs:qe].to(work)
        m = torch.full((batch, qe - qs), float("-inf"), dtype=work, device=q.device)
        l = torch.zeros((batch, qe - qs), dtype=acc_dtype, device=q.device)
        acc = torch.zeros((batch, qe - qs, d), dtype=acc_dtype, device=q.device)
        last = key_end
        if is_causal:
            # correct: keys up to row qe-1 inclusive, i.e. stop before qe
            last = min(key_end, qe - 1 if "causal_skip_needed_tile" in bugs else qe)
            if "causal_bottom_right" in bugs:  # the diagonal through the last query and the last key
                last = min(key_end, max(qe + n_k - n_q, 0))
        for ks in range(0, last, tile):
            ke = min(ks + tile, key_end)
            s = _mm(q_i, kf[:, ks:ke].to(work).transpose(1, 2), bugs, q.dtype) * scale
            if is_causal:
                rows = torch.arange(qs, qe, device=q.device)[:, None]
                cols = torch.arange(ks, ke, device=q.device)[None, :]
                shift = 1 if "causal_off_by_one" in bugs else 0  # sees one future key
                shift += n_k - n_q if "causal_bottom_right" in bugs else 0
                s = s.masked_fill(cols > rows + shift, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = (alpha * l + p.sum(-1)).to(acc_dtype)
            pv = _mm(p, vf[:, ks:ke].to(work), bugs, q.dtype)
            if "no_rescale" in bugs:
                acc = (acc + pv).to(acc_dtype)  # forgets to rescale O when the max moves
            else:
                acc = (alpha[..., None] * acc + pv).to(acc_dtype)
            m = m_new
        out = acc.to(work) if "no_final_normalisation" in bugs else acc.to(work) / l.to(work)[..., None]
        rows_written = qe - 1 if ("unwritten_last_row" in bugs and qe == n_q) else qe
        o[:, qs:rows_written] = out[:, : rows_written - qs].to(q.dtype)
        lse[:, qs:qe] = torch.log(l.to(work)) if "lse_missing_max" in bugs else m + torch.log(l.to(work))
    if "nondeterministic" in bugs:
        o = o + (torch.rand((), dtype=torch.float64) < 0.5) * torch.finfo(o.dtype).eps * o.abs()
    return o.reshape(q.shape), lse.reshape(q.shape[:-1]), scale, is_causal


def _backward(q, k, v, o, lse, do, is_causal, scale, bugs):
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    q_, k_, v_, o_, do_ = (t.to(work) for t in (q, k, v, o, do))
    mm = lambda a, b: _mm(a, b, bugs, q.dtype)  # noqa: E731
    s = mm(q_, k_.transpose(-1, -2)) * scale
    if is_causal:
        i = torch.arange(q.shape[-2], device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        shift = k.shape[-2] - q.shape[-2] if "causal_bottom_right" in bugs else 0
        s = s.masked_fill(j > i + shift, float("-inf"))
    p = torch.exp(s - lse.to(work)[..., None])
    dv = mm(p.transpose(-1, -2), do_)
    dp = mm(do_, v_.transpose(-1, -2))
    d_rows = (do_ * o_).sum(-1, keepdim=True)
    ds = p * dp if "backward_without_D" in bugs else p * (dp - d_rows)
    dq = mm(ds, k_) * scale
    if "fast_path_dq_unscaled" in bugs and not torch.are_deterministic_algorithms_enabled():
        dq = mm(ds, k_)  # the default (fast) path's convert step forgets the scale; the deterministic one is right
    dk = mm(ds.transpose(-1, -2), q_) if "dk_missing_scale" in bugs else mm(ds.transpose(-1, -2), q_) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _validate(q, k, v, is_causal, scale, bugs):
    """impl's validation, or one of its checks left out or made too strict."""
    if "value_head_dim_unchecked" in bugs and all(isinstance(t, torch.Tensor) for t in (q, v)):
        v = v[..., : q.shape[-1]]  # only V's rows and leading dims are compared
    if "bad_scale_accepted" in bugs and isinstance(scale, float) and not (math.isfinite(scale) and scale > 0):
        scale = None  # only the type of the scale is checked
    if "three_or_four_dims_only" in bugs and isinstance(q, torch.Tensor) and q.dim() not in (3, 4):
        raise ValueError(f"attention: expected (B, N, d) or (B, H, N, d) inputs, got {tuple(q.shape)}")
    max_head_dim = 128 if "head_dim_capped_at_128" in bugs else 256
    validate_attention_inputs(q, k, v, is_causal, scale, dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
                              max_head_dim=max_head_dim)


def buggy_flash(bugs: frozenset):
    class BuggyFlash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False, scale=None):
            try:
                _validate(q, k, v, is_causal, scale, bugs)
            except (TypeError, ValueError) as exc:
                if "vague_input_errors" in bugs:
                    raise type(exc)("invalid input") from None
                raise
            if "output_memoised_by_address" in bugs:  # "the same inputs again: skip the work"
                key = (tuple((t.data_ptr(), t.shape, t.stride()) for t in (q, k, v)), q.dtype, q.device,
                       bool(is_causal), scale)
                if key not in _BY_ADDRESS:
                    _BY_ADDRESS[key] = _forward(q, k, v, bool(is_causal), scale, bugs)
                o, lse, used_scale, is_causal = _BY_ADDRESS[key]
                o, lse = o.clone(), lse.clone()
            else:
                o, lse, used_scale, is_causal = _forward(q, k, v, bool(is_causal), scale, bugs)
            if "float64_lse_in_float32" in bugs and lse.dtype == torch.float64:
                lse = lse.float().double()  # L kept in a float32 buffer whatever the inputs
            if "saves_flattened_lse" in bugs:
                lse = lse.reshape(-1, lse.shape[-1]) if lse.dim() > 2 else lse.reshape(-1)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal, ctx.scale = bool(is_causal), used_scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            lse = lse.reshape(q.shape[:-1])
            return (*_backward(q, k, v, o, lse, do, ctx.is_causal, ctx.scale, bugs), None, None)

    BuggyFlash.__name__ = "BuggyFlash_" + "_".join(sorted(bugs)) if bugs else "BuggyFlash_correct"
    return BuggyFlash


@dataclass(frozen=True)
class BuggyFlashSpec:
    name: str
    bug: str  # what is wrong, in a sentence
    caught_by: tuple[str, ...]  # laws (conformance.laws.attention.laws) or spec checks that must reject it
    bugs: frozenset = field(default=frozenset())

    def target(self):
        fn = buggy_flash(self.bugs or frozenset({self.name}))
        return SimpleNamespace(get_flashattention_autograd_function_pytorch=lambda: fn, __name__=f"mutant:{self.name}")


SPECS = (
    BuggyFlashSpec("no_rescale", "O accumulator not rescaled by exp(m_old - m_new) when the running max moves",
           ("forward_matches_float64_reference", "contract_forward_matches_float64_reference")),
    BuggyFlashSpec("causal_off_by_one", "causal mask lets query i see key i+1",
           ("causal_output_ignores_future_keys", "forward_matches_float64_reference",
            "contract_causal_output_ignores_future_keys")),
    BuggyFlashSpec("drop_partial_tile", "the last partial key tile is never visited",
           ("forward_matches_float64_reference", "permuting_keys_and_values_together_leaves_output_unchanged",
            "spec:odd_sequence_lengths")),
    BuggyFlashSpec("scale_one_over_d", "default softmax scale 1/d instead of 1/sqrt(d)",
           ("forward_matches_float64_reference",)),
    BuggyFlashSpec("lse_missing_max", "L = log(l) without the running max m",
           ("logsumexp_is_row_logsumexp_and_at_least_row_max", "gradients_match_float64_reference",
            "contract_logsumexp_is_row_logsumexp")),
    BuggyFlashSpec("backward_without_D", "dS = P * dP, missing the - D_i term (D = rowsum(dO * O))",
           ("gradients_match_float64_reference", "float64_gradcheck", "contract_gradients_match_float64_reference")),
    BuggyFlashSpec("dk_missing_scale", "dK not multiplied by the softmax scale",
           ("gradients_match_float64_reference", "float64_gradcheck")),
    BuggyFlashSpec("fast_path_dq_unscaled", "outside torch's deterministic-algorithms mode (the path a user runs) "
           "dQ misses the softmax scale, as a fast atomic-dQ path whose convert step forgets it; the deterministic "
           "path, which the oracle's poisoned allocations switch on, is right",
           ("gradients_match_float64_reference", "contract_gradients_match_float64_reference")),
    BuggyFlashSpec("causal_bottom_right", "causal mask aligned bottom-right where N_q != N_k (query i sees keys up to i + N_k - N_q), not top-left",
           ("spec:causal_masking_in_every_extra_shape", "spec:unequal_query_and_key_lengths")),
    BuggyFlashSpec("tf32_dots", "float32 matrix products with their operands rounded to TF32 (tl.dot's default on NVIDIA GPUs): within the course's 1e-2, far from float32 accuracy",
           ("spec:float32_inputs_keep_float32_accuracy", "forward_matches_float64_reference")),
    BuggyFlashSpec("causal_skip_needed_tile", "causal tile-skip stops one key short, skipping a needed key tile",
           ("forward_matches_float64_reference",)),
    BuggyFlashSpec("fp16_accumulators", "running sum and O accumulator kept in fp16",
           ("forward_matches_float64_reference",)),
    BuggyFlashSpec("unwritten_last_row", "the kernel never writes the last query row",
           ("forward_matches_float64_reference",)),
    BuggyFlashSpec("no_final_normalisation", "O returned without dividing by the softmax denominator l",
           ("constant_values_give_constant_output", "forward_matches_float64_reference")),
    BuggyFlashSpec("batch_mixing", "every batch element attends to batch element 0's keys",
           ("batch_elements_are_independent", "forward_matches_float64_reference")),
    BuggyFlashSpec("input_precision_accumulators", "O and the softmax denominator l accumulated in the input precision (bf16)",
           ("contract_long_sequences_in_bf16_match_float64_reference",)),
    BuggyFlashSpec("output_in_float32", "O returned in float32 for bf16 (and fp16) inputs",
           ("contract_bf16_runs_and_keeps_the_contracts_dtypes",)),
    BuggyFlashSpec("nondeterministic", "forward adds 1-ulp noise on some calls (e.g. an unordered atomic reduction)",
           ("forward_is_bitwise_deterministic",)),
    BuggyFlashSpec("causal_flag_cached_by_lengths", "the causal flag remembered per (N_q, N_k), as a mask cached by lengths alone: a later call with the other flag gets the first one's mask",
           ("results_do_not_depend_on_earlier_calls",)),
    BuggyFlashSpec("output_buffer_reused", "O written into one buffer kept per shape and returned as is: the next call of that shape overwrites it",
           ("results_do_not_depend_on_earlier_calls",)),
    BuggyFlashSpec("output_memoised_by_address", "O and L remembered per input address (and shape, strides, dtype, flags) and handed back when the same tensors come again: a training loop that writes new values into them gets the first call's O",
           ("fresh_values_at_recycled_addresses_give_fresh_results",)),
    BuggyFlashSpec("vague_input_errors", "bad input raises ValueError('invalid input'): the message names neither the problem nor the values",
           ("spec:bad_input_errors",)),
    BuggyFlashSpec("value_head_dim_unchecked", "V's head dim never compared with Q's: a mismatched V crashes deep in the computation",
           ("spec:bad_input_errors",)),
    BuggyFlashSpec("bad_scale_accepted", "a softmax scale of 0, a negative one, NaN or Inf accepted: NaN or meaningless outputs",
           ("spec:bad_input_errors",)),
    BuggyFlashSpec("three_or_four_dims_only", "(N, d) and (B, H, G, N, d) inputs refused, though the contract allows any leading dims",
           ("spec:other_numbers_of_leading_dims",)),
    BuggyFlashSpec("head_dim_capped_at_128", "head dims above 128 refused, below the documented maximum of 256",
           ("spec:odd_head_dims",)),
    BuggyFlashSpec("float64_lse_in_float32", "L rounded to float32 for float64 inputs: float64 gradients good to float32's ~1e-8 only",
           ("float64_gradcheck",)),
    BuggyFlashSpec("compiled_per_shape_with_a_limit", "one compiled variant per input shape and an error past eight, as torch.compile with dynamic=False and fullgraph=True",
           ("spec:many_shapes_in_one_process",)),
    BuggyFlashSpec("keys_padded_to_64_unmasked", "keys read in 64-key tiles, zeros past N and no mask: wrong wherever N is not a multiple of 64 (N = 16, 32)",
           ("spec:outputs_at_every_handout_size",)),
    BuggyFlashSpec("float32_inputs_only", "bf16 and fp16 inputs crash: P kept in float32 multiplies a 16-bit V tile",
           ("spec:sixteen_bit_outputs_at_the_contract_shape", "spec:sixteen_bit_gradients_at_the_contract_shape")),
    BuggyFlashSpec("saves_flattened_lse", "L saved as (B*H, N) instead of q.shape[:-1], breaking the CS336 contract",
           ("spec:saves_one_logsumexp_of_query_shape",)),
)


def _plan_key_without_strides():
    """impl's Triton attention with its launch plans keyed on shapes, dtypes and devices but
    not strides: a later call with the same shapes in another layout reuses the first
    layout's strides (our own fast path's one way to go wrong)."""
    from impl.attention import flash_triton as ft

    class PlanKeyWithoutStrides(ft.FlashAttentionTriton):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False, scale=None):
            # strides dropped, nothing else: with the alignment dropped too, a misaligned input
            # on a GPU reuses a kernel compiled for aligned ones and faults (a sticky CUDA error)
            key = ("mutant: no strides", type(is_causal), is_causal, type(scale), scale,
                   tuple((t.shape, t.dtype, t.device, t.data_ptr() % 16 == 0) for t in (q, k, v)))
            plan = ft._forward_plan(q, k, v, is_causal, scale, key)
            o, lse = plan(q, k, v)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal, ctx.scale, ctx.plan_key = plan.is_causal, plan.scale, key
            return o

    return PlanKeyWithoutStrides


def _v_read_with_k_strides():
    """impl's Triton attention handed V with K's strides (a launch that passes one tensor's
    strides for another's): right whenever K and V share a layout."""
    from impl.attention import flash_triton as ft

    class VReadWithKStrides(ft.FlashAttentionTriton):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False, scale=None):
            if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.shape == v.shape and k.stride() != v.stride():
                v = torch.as_strided(v, v.shape, k.stride(), v.storage_offset())
            return ft.FlashAttentionTriton.forward(ctx, q, k, v, is_causal, scale)

    return VReadWithKStrides


def _backward_plan_key_without_grad_output():
    """impl's Triton attention with its backward plans keyed on the forward's inputs alone:
    a later backward whose dO has another layout reuses the first dO's strides."""
    from impl.attention import flash_triton as ft

    class BackwardKeyWithoutGradOutput(ft.FlashAttentionTriton):
        @staticmethod
        def backward(ctx, grad_o):
            q, k, v, o, lse = ctx.saved_tensors
            if grad_o.dtype != q.dtype:
                grad_o = grad_o.to(q.dtype)
            key = ("mutant: bwd without dO", ctx.plan_key, ft._determinism())
            plan = ft._cached_plan(key, lambda: ft._BackwardPlan(q, k, v, o, lse, grad_o, ctx.is_causal, ctx.scale))
            return (*plan(q, k, v, o, lse, grad_o), None, None)

    return BackwardKeyWithoutGradOutput


def _impl_triton():
    from impl.attention.flash_triton import FlashAttentionTriton

    return FlashAttentionTriton


plan_key_without_strides = SimpleNamespace(get_flashattention_autograd_function_triton=_plan_key_without_strides,
                                           __name__="mutant:plan_key_without_strides")
v_read_with_k_strides = SimpleNamespace(get_flashattention_autograd_function_triton=_v_read_with_k_strides,
                                        __name__="mutant:v_read_with_k_strides")
backward_plan_key_without_grad_output = SimpleNamespace(
    get_flashattention_autograd_function_triton=_backward_plan_key_without_grad_output,
    __name__="mutant:backward_plan_key_without_grad_output")

def _call_graphs_on() -> None:
    """The call graphs are off unless LLM_SYSTEMS_CALL_GRAPHS=1; a target whose bug (or whose
    control) lives in them switches them on, in its process (a Gluon run's own child)."""
    from impl.attention import call_graphs

    call_graphs.ENABLED = True


def _gluon_mutant(name: str, graphs_on: bool = False):
    def factory():
        from impl.attention.flash_gluon import mutant_function

        if graphs_on:
            _call_graphs_on()
        return mutant_function(name)

    return SimpleNamespace(get_flashattention_autograd_function_gluon=factory, __name__=f"mutant:{name}")


def _gluon_with_call_graphs():
    from impl.attention.flash_gluon import FlashAttentionGluon

    _call_graphs_on()
    return FlashAttentionGluon


# The host mutant's second control: impl's Gluon flavour, unbroken, with the graphs on (so its
# rejection is the key's doing, not the graphs'; and the graphs' replays meet its law in full).
correct_with_call_graphs = SimpleNamespace(get_flashattention_autograd_function_gluon=_gluon_with_call_graphs,
                                           __name__="control:correct_with_call_graphs")


# The schedule's own bugs, in impl's Gluon kernel (impl/attention/flash_gluon.py, MUTANTS):
# they show on a Hopper GPU only, and read "not run here" elsewhere.
GLUON_SPECS = (
    ("v_slot_freed_before_its_product",
     "impl's Gluon forward hands V_j's ring slot back to the loader as soon as V_j lands, one P V product before "
     "it reads it: TMA overwrites the tile with V_{j+STAGES} before its consumer is done"),
    ("ready_phase_off_by_one",
     "impl's Gluon forward waits on the K slot's ready barrier with the wrong parity: a fresh barrier reports it "
     "complete at once, so the scores read K before TMA has landed it, and a landed one never completes again "
     "(the kernel hangs)"),
    ("discarded_split_counted",
     "impl's Gluon forward on a small grid (keys in splits) stores the sums of a split that has no keys of its own "
     "(it ran key tile 0 to keep the schedule): the combine counts key tile 0 twice for those query tiles"),
)
# Shows only where a program's keys span several tiles.  The forward cuts a short grid's keys into
# splits, down to one key tile a split (_forward_splits).  Of the contract's shapes (up to four
# batch elements, lengths up to 1024) only three or four batch elements of length 1024, and d 64 at
# length 256 (unsplit since MIN_KEY_TILES_TO_SPLIT), give a program two key tiles: a few draws in a
# hundred, and the contract law passed the mutant in one GPU run (2026-11-29).  The wider law's
# boundary cases (40 heads of a thousand keys: no split, eight key tiles a program) show it every
# run, so it alone is named.
GLUON_MULTI_TILE_SPECS = (
    ("rescale_skipped",
     "impl's Gluon forward does not rescale the running output by exp(m_old - m_new) when the row maximum moves "
     "between key tiles"),
)
# Shows only where a program walks several work items (more query tiles than the GPU has SMs):
# the contract's shapes never have that many, so the wider law alone is named.
GLUON_PERSISTENT_SPECS = (
    ("q_freed_before_its_last_scores",
     "impl's persistent Gluon forward hands Q's buffer back to the loader after a work item's first scores, not "
     "its last: the loader brings the program's next item's Q while this item's last scores still read it"),
)
GLUON_BACKWARD_SPECS = (
    ("last_dq_partial_never_added",
     "impl's Gluon backward (five products, d 64) stages each tile's dS K partial under the next tile's products "
     "and never adds the last tile's: the last query tile a key tile sees loses that key tile's share of dQ"),
    ("stats_read_from_the_next_slot",
     "impl's Gluon backward (the dK/dV kernel, every form) reads a query tile's L and D from the ring slot after "
     "the tile's own: P = exp(S - L) and dS = P (dP - D) use another tile's rows (or rows never written there)"),
)
# The host path's: a call's launches replayed from a CUDA graph (impl/attention/call_graphs.py; the
# mutant's target switches the graphs on).
GLUON_HOST_SPECS = (
    ("graph_keyed_without_outputs",
     "impl's Gluon flavour keys the CUDA graphs of a call's launches on the inputs' addresses alone: a call whose "
     "inputs lie where an earlier one's did replays launches that write into the earlier call's outputs"),
)
# The eager repeat's look-up: a call's C++ pass found by its key (impl/attention/flash_gluon.py,
# _bound_call; the C++ launcher is on by default).
GLUON_KEY_SPECS = (
    ("bound_key_without_strides",
     "impl's Gluon flavour binds a call's C++ pass to a key without the tensors' strides: a later call of the same "
     "shapes in another layout runs the earlier call's launches, whose fixed strides read dO (and O) as laid out "
     "before"),
)
for _name, _ in GLUON_SPECS + GLUON_MULTI_TILE_SPECS + GLUON_PERSISTENT_SPECS + GLUON_BACKWARD_SPECS + GLUON_KEY_SPECS:
    globals()[_name] = _gluon_mutant(_name)
for _name, _ in GLUON_HOST_SPECS:
    globals()[_name] = _gluon_mutant(_name, graphs_on=True)

MUTANTS = tuple(
    Mutant(m.name, "attention", m.bug, m.caught_by, target=f"{__name__}:{m.name}", flavour="pytorch") for m in SPECS
) + tuple(
    Mutant(name, "attention", bug, ("forward_matches_float64_reference", "contract_forward_matches_float64_reference"),
           target=f"{__name__}:{name}", flavour="gluon") for name, bug in GLUON_SPECS
) + tuple(
    Mutant(name, "attention", bug, ("forward_matches_float64_reference",), target=f"{__name__}:{name}",
           flavour="gluon") for name, bug in GLUON_MULTI_TILE_SPECS + GLUON_PERSISTENT_SPECS
) + tuple(
    Mutant(name, "attention", bug, ("gradients_match_float64_reference", "contract_gradients_match_float64_reference"),
           target=f"{__name__}:{name}", flavour="gluon") for name, bug in GLUON_BACKWARD_SPECS
) + tuple(
    Mutant(name, "attention", bug, ("fresh_values_at_recycled_addresses_give_fresh_results",),
           target=f"{__name__}:{name}", flavour="gluon") for name, bug in GLUON_HOST_SPECS
) + tuple(
    Mutant(name, "attention", bug, ("results_do_not_depend_on_earlier_calls",),
           target=f"{__name__}:{name}", flavour="gluon") for name, bug in GLUON_KEY_SPECS
) + (
    Mutant("plan_key_without_strides", "attention",
           "impl's Triton launch plans keyed without the inputs' strides: another layout of the same shapes reuses stale strides",
           ("results_do_not_depend_on_earlier_calls",), target=f"{__name__}:plan_key_without_strides", flavour="triton"),
    Mutant("v_read_with_k_strides", "attention",
           "impl's Triton forward reads V with K's strides: right only while K and V share a layout",
           ("forward_matches_float64_reference",), target=f"{__name__}:v_read_with_k_strides", flavour="triton"),
    Mutant("backward_plan_key_without_grad_output", "attention",
           "impl's Triton backward plans keyed without dO's signature: a later dO in another layout reuses stale strides",
           ("results_do_not_depend_on_earlier_calls",), target=f"{__name__}:backward_plan_key_without_grad_output", flavour="triton"),
)

# Every mutant as a module attribute, so `--target conformance.mutants.attention:no_rescale` works.
globals().update({m.name: m.target() for m in SPECS})
correct = BuggyFlashSpec("correct", "no bug: the mutants' shared implementation with every switch off", ()).target()
correct.get_flashattention_autograd_function_pytorch = (lambda fn=buggy_flash(frozenset()): fn)
correct.get_flashattention_autograd_function_triton = _impl_triton  # the control of the Triton-flavour mutant
correct.get_flashattention_autograd_function_gluon = lambda: __import__(  # and of the Gluon-flavour ones
    "impl.attention.flash_gluon", fromlist=["FlashAttentionGluon"]).FlashAttentionGluon
