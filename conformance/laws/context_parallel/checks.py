"""Comparisons: each ``check_*`` takes the subject (a target spec string) and a case, and
raises AssertionError when the target breaks the law (a verdict when it cannot be checked
here).  Ranks run ``rank.py``'s functions; references come from ``reference.py``; every
tolerance comes from ``conformance.oracle``.

Sources.  No course handout covers context parallelism.  What a check pins comes from one
of: the protocol the capability's issue published (``conformance/target.py``: the entry
points, the two layouts, natural-log L, one saved logsumexp); Ring Attention (Liu et al.
2023: blockwise attention merged by log-sum-exp, K/V blocks passed around a ring while the
current block is computed); the zigzag layout of Llama 3 (Dubey et al. 2024, context
parallelism: 2W chunks, rank i holds chunks i and 2W-1-i to balance causal work), which is
torch's head-tail load balancing; torch.distributed's point-to-point contract (a buffer is
read or filled only once its request is waited on); torch's scaled_dot_product_attention
(output in the query's dtype, float32 logsumexp).  Each check's docstring says which.  A
count that none of these fixes (messages, their peers and bytes, the granularity of causal
skipping, FLOPs) is bounded from the user's side in the contract, and its exact figure is
an extra.
"""

from __future__ import annotations

import math
import re

import torch

from conformance import oracle
from conformance.harness import run_on_ranks
from conformance.laws.context_parallel import rank, reference
from conformance.laws.p2p_hang import first_hang
from conformance.target import load_target
from conformance.verdicts import EnvironmentRefusal, NotApplicable

CASE_TIMEOUT_S = 120.0
METADATA_BYTES = 1024  # bytes a forward may take in besides K/V blocks: a shape check across ranks
FWD_FLOPS_PER_PAIR = 4  # x d: S = Q K^T and P V, 2 d each (FlashAttention-2's forward)
# x d: FlashAttention-2's backward recomputes S and forms dV, dP, dQ, dK (10 d); a backward
# through autograd on a recomputed block also forms P V again (12 d).  Either is a pass;
# computing a fully masked block as well is not (it at least doubles some rank's work).
BWD_FLOPS_PER_PAIR = 12


def _target(subject):
    return load_target(subject)


def _on_ranks(fn, case, *args):
    return run_on_ranks(fn, case.world_size, *args, timeout=CASE_TIMEOUT_S)


def names_a_quantity(message: str, values) -> bool:
    """Whether an error message names one of ``values`` (the offending sizes in every unit
    the check accepts: tokens, elements, bytes, chunks) as a whole number."""
    return any(re.search(rf"(?<![\d.]){int(v)}(?![\d]|\.\d*[1-9])", message) for v in values)


def require_clear_error(what: str, message: str | None, values) -> None:
    """``message`` (an error's "Type: text", None when nothing was raised) must exist and
    name one of ``values``: any exception type, any wording."""
    if message is None:
        raise AssertionError(f"{what} was accepted; expected an error naming the offending size")
    if not names_a_quantity(message, values):
        raise AssertionError(f"{what}: the error does not name the offending size (any of {sorted(set(values))} "
                             f"in tokens, elements or bytes): {message[:300]}")


# --- merge --------------------------------------------------------------------------------


def _merge_inputs(case):
    g = torch.Generator().manual_seed(case.seed)
    q, k = (torch.randn(*case.batch, n, case.d, generator=g, dtype=torch.float64) * case.value_scale
            for n in (case.n_q, case.n_k))
    v = torch.randn(*case.batch, case.n_k, case.d, generator=g, dtype=torch.float64)
    q, k, v = (t.to(case.dtype).to(torch.float64) for t in (q, k, v))  # the reference sees rounded inputs
    visible = torch.rand(case.n_q, case.n_k, generator=g) >= case.mask_density
    if case.masked_block >= 0:
        lo, hi = case.blocks[case.masked_block]
        visible[:, lo:hi] = False
    return q, k, v, visible


def _merge_in_tree(merge, partials, order, tree):
    items = [partials[i] for i in order]
    for at in tree:
        (o1, l1), (o2, l2) = items[at], items[at + 1]
        items[at:at + 2] = [tuple(merge(o1, l1, o2, l2))]
    return items[0]


def check_merge_partition(subject, case):
    """Merging the partials of any partition of the keys, in any order and grouping, gives
    full attention's O and L (fully masked blocks included).

    Sources: the values are the log-sum-exp merge of Ring Attention (its blockwise
    softmax), judged by the float64 oracle; L is natural-log and a row that sees no key has
    L = -inf (the log of an empty sum) and O = 0 (the empty weighted sum): the protocol's
    ``merge_attention_partials``.  Shapes: O like o1, L like lse1 (the protocol)."""
    merge = _target(subject).factory("merge_attention_partials")
    q, k, v, visible = _merge_inputs(case)
    partials = []
    for lo, hi in case.blocks:
        o_b, l_b = reference.attention(q, k[..., lo:hi, :], v[..., lo:hi, :], key_mask=visible[:, lo:hi])
        partials.append((o_b.to(case.dtype), l_b.to(torch.float32)))
    o, lse = _merge_in_tree(merge, partials, case.order, case.tree)
    ref_o, ref_l = reference.attention(q, k, v, key_mask=visible)
    eager_o, eager_l = reference.attention(*(t.to(case.dtype) for t in (q, k, v)), key_mask=visible)
    if o.shape != ref_o.shape or lse.shape != ref_l.shape:
        raise AssertionError(f"merge returned O {tuple(o.shape)}, L {tuple(lse.shape)}; expected "
                             f"{tuple(ref_o.shape)}, {tuple(ref_l.shape)}")
    empty = ~torch.isfinite(ref_l)  # rows that see no key at all
    if bool(empty.any()):
        lo_ = lse.detach().double()[empty]
        oo = o.detach().double()[empty]
        if not (bool((lo_ == float("-inf")).all()) and bool((oo == 0).all())):
            raise AssertionError("rows that see no key in any block must merge to O = 0, L = -inf; got "
                                 f"L {lo_[:4].tolist()}, |O| max {float(oo.abs().max()) if oo.numel() else 0.0}")
    scale = 1.0 / math.sqrt(case.d)
    mag_s = (scale * (q.abs() @ k.abs().transpose(-1, -2))).masked_fill(~visible, 0.0)
    p = torch.exp(torch.nan_to_num((q @ k.transpose(-1, -2)) * scale - ref_l[..., None], nan=-math.inf)).masked_fill(~visible, 0.0)
    oracle.assert_close("merged O", o, ref_o, eager_o, case.dtype, magnitude=p @ v.abs())
    oracle.assert_close("merged L", lse, ref_l, eager_l, torch.float32, magnitude=ref_l.abs().nan_to_num(posinf=0, neginf=0) + mag_s.amax(-1))


def _partial(case, g, masked):
    o = torch.randn(*case.batch, case.n, case.d, generator=g, dtype=torch.float64).to(case.dtype)
    lse = (torch.randn(*case.batch, case.n, generator=g, dtype=torch.float64) * case.lse_scale).to(torch.float32)
    o = o.masked_fill(masked[..., None], 0.0)
    lse = lse.masked_fill(masked, float("-inf"))
    return o, lse


def check_merge_identity(subject, case):
    """(0, -inf) is an exact identity on either side; two fully masked partials merge to
    (0, -inf) with no NaN; any two partials merge to finite values where either is finite.

    Sources: the protocol's empty partial (0, -inf), and the merge equation, under which the
    empty block's weight is exp(-inf) = 0 and the other's exp(0) = 1 exactly in IEEE
    arithmetic: every numerically stable form (max-subtracted, logaddexp, sigmoid) gives
    the partial back bit for bit.  Finite results for L up to 1e4: Ring Attention's merge is
    written to be stable (exponents of differences, never of L itself)."""
    merge = _target(subject).factory("merge_attention_partials")
    g = torch.Generator().manual_seed(case.seed)
    masked = torch.rand(*case.batch, case.n, generator=g) < case.masked_rows
    o, lse = _partial(case, g, masked)
    zero = torch.zeros_like(o)
    none = torch.full_like(lse, float("-inf"))
    for name, (a, b) in {"merge(p, empty)": ((o, lse), (zero, none)), "merge(empty, p)": ((zero, none), (o, lse))}.items():
        mo, ml = merge(*a, *b)
        oracle.assert_bitwise_equal(f"{name} O", mo.to(o.dtype), o)
        oracle.assert_bitwise_equal(f"{name} L", ml.to(lse.dtype), lse)
    mo, ml = merge(zero, none, zero, none)
    if bool(torch.isnan(mo).any()) or bool(torch.isnan(ml).any()):
        raise AssertionError("merging two fully masked partials (L = -inf) gave NaN")
    if not (bool((ml == float("-inf")).all()) and bool((mo == 0).all())):
        raise AssertionError(f"merging two fully masked partials must give (0, -inf); got L {ml.flatten()[:4].tolist()}")
    o2, lse2 = _partial(case, g, torch.rand(*case.batch, case.n, generator=g) < case.masked_rows)
    mo, ml = merge(o, lse, o2, lse2)
    some = torch.isfinite(lse) | torch.isfinite(lse2)
    if not (bool(torch.isfinite(ml[some]).all()) and bool(torch.isfinite(mo[some]).all())):
        raise AssertionError(f"merging partials with L up to {float(lse.abs().nan_to_num(posinf=0, neginf=0).max()):.3g} "
                             "gave a non-finite O or L (exponentials of L without the max subtracted overflow)")
    if bool(torch.isnan(mo).any()) or bool(torch.isnan(ml).any()):
        raise AssertionError("merge gave NaN on rows where both partials are fully masked")


# --- layout ---------------------------------------------------------------------------------


def check_layout_roundtrip(subject, case):
    """Each rank's shard is exactly its layout's chunks in order; unsharding every rank's
    shard gives back the tensor bit for bit; a length that does not cut into equal chunks
    is a clear error (any type, any wording that names the length or the chunk count).

    Sources: the layouts are the protocol's: contiguous (chunk r of W, torch's context
    parallelism without load balancing) and zigzag (chunks r and 2W-1-r of 2W, Llama 3's
    load-balanced layout and torch's head-tail one).  Bit-for-bit: sharding moves values,
    it computes none."""
    t = _target(subject)
    shard, unshard = t.factory("context_parallel_shard"), t.factory("context_parallel_unshard")
    g = torch.Generator().manual_seed(case.seed)
    x = torch.randn(*case.shape, generator=g)
    W = case.world_size
    shards = [shard(x, W, r, case.layout, case.dim) for r in range(W)]
    for r, s in enumerate(shards):
        oracle.assert_bitwise_equal(f"rank {r}'s {case.layout} shard", s, reference.shard(x, W, r, case.layout, case.dim))
    oracle.assert_bitwise_equal("unshard(shard(x))", unshard(shards, case.layout, case.dim), x)
    pieces = reference.n_chunks(W, case.layout)
    if pieces > 1:
        bad = torch.randn(*[n + 1 if i == case.dim % x.dim() else n for i, n in enumerate(x.shape)], generator=g)
        check_uneven_length_is_a_clear_error(shard, bad, W, case.layout, case.dim)


def check_uneven_length_is_a_clear_error(shard, x, world_size, layout, dim=-2) -> None:
    """Sharding a length that does not cut into the layout's equal chunks raises an error
    naming the length or the number of chunks (the protocol's helpers cut equal chunks;
    the wording is free)."""
    length, pieces = x.shape[dim], reference.n_chunks(world_size, layout)
    try:
        shard(x, world_size, 0, layout, dim)
    except Exception as exc:  # noqa: BLE001 - any clear error will do
        message = f"{type(exc).__name__}: {exc}"
    else:
        message = None
    require_clear_error(f"sharding length {length} into {pieces} {layout} chunks", message, (length, pieces))


def check_positions(subject, case):
    """A rank's RoPE positions are the slice of the full sequence's positions its shard
    holds: RoPE of the shard at those positions is the shard of RoPE of the whole.

    Source: the protocol's ``context_parallel_positions`` (positions = shard(arange(N))),
    what RoPE needs for a shard to equal the whole sequence's slice."""
    t = _target(subject)
    positions, shard = t.factory("context_parallel_positions"), t.factory("context_parallel_shard")
    n, W = case.seq_len, case.world_size
    g = torch.Generator().manual_seed(case.seed)
    x = torch.randn(2, n, 8, generator=g)
    whole = reference.rope(x, torch.arange(n))
    for r in range(W):
        pos = torch.as_tensor(positions(n, W, r, case.layout)).cpu()
        expected = reference.positions(n, W, r, case.layout)
        if pos.shape != expected.shape or not torch.equal(pos.long(), expected):
            raise AssertionError(f"rank {r} ({case.layout}, W={W}, N={n}): positions {pos.tolist()}, expected {expected.tolist()}")
        oracle.assert_bitwise_equal(f"rank {r}: RoPE of the shard", reference.rope(shard(x, W, r, case.layout), pos.long()),
                                    reference.shard(whole, W, r, case.layout))


def check_zigzag_balance(subject, case):
    """Under causal masking the zigzag layout gives every rank the same number of attended
    (query, key) pairs.

    Source: Llama 3's reason for the layout (chunks i and 2W-1-i: every rank the same causal
    work), which follows exactly from the chunks the protocol fixes."""
    positions = _target(subject).factory("context_parallel_positions")
    n, W = case.seq_len, case.world_size
    pairs = [reference.causal_pairs(torch.as_tensor(positions(n, W, r, "zigzag")).cpu().long()) for r in range(W)]
    covered = sorted(int(p) for r in range(W) for p in torch.as_tensor(positions(n, W, r, "zigzag")).tolist())
    if covered != list(range(n)):
        raise AssertionError(f"zigzag positions over W={W} do not cover 0..{n - 1} once each")
    if len(set(pairs)) != 1:
        raise AssertionError(f"zigzag (W={W}, N={n}): attended pairs per rank {pairs} differ")


# --- ring ------------------------------------------------------------------------------------


def _members(results, case):
    """The results of the ranks the sequence was sharded over, in group-rank order."""
    return [results[m] for m in case.members] if case.members else results


def _unshard(results, key, layout):
    return reference.unshard([r[key] for r in results], layout, dim=-1 if key == "L" else -2)


def _references(case):
    q, k, v, do = case.make()
    ref, eager = {}, {}
    for store, dtype in ((ref, torch.float64), (eager, case.dtype)):
        qq, kk, vv = (t.to(dtype).detach().requires_grad_() for t in (q, k, v))
        o, lse = reference.attention(qq, kk, vv, case.is_causal)
        o.backward(do.to(dtype))
        store.update(O=o.detach(), L=lse.detach(), dQ=qq.grad, dK=kk.grad, dV=vv.grad)
    q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
    mags = reference.attention_magnitudes(q64, k64, v64, do64, case.is_causal, 1.0 / math.sqrt(case.d), case.dtype)
    return ref, eager, mags


def _lse_dtypes(dtype):
    """Saved L dtypes accepted: float32 (torch's SDPA kernels and FlashAttention keep L in
    float32 whatever the input dtype) or wider; float64 inputs need float64."""
    return (torch.float64,) if dtype == torch.float64 else (torch.float32, torch.float64)


def check_ring_parity(subject, case, probe: str = "none"):
    """Unsharded O, L and dQ, dK, dV equal single-process attention on the whole sequence
    (oracle tolerance).

    Sources: Ring Attention computes exact attention (no approximation), so the whole
    sequence's float64 attention is the reference; O and the gradients come back in the
    input dtype (torch's scaled_dot_product_attention and autograd); one saved logsumexp of
    shape q.shape[:-1] in float32 or wider (the protocol; torch's SDPA kernels)."""
    results = _members(_on_ranks(rank.rank_ring, case, subject, case, probe), case)
    lse_dtypes = _lse_dtypes(case.dtype)
    for r, res in enumerate(results):
        wrong = {key: res[key].dtype for key in ("O", "dQ", "dK", "dV") if res[key].dtype != case.dtype}
        if res["L"].dtype not in lse_dtypes:
            wrong["L"] = res["L"].dtype
        if wrong:
            raise AssertionError(f"rank {r}: dtypes {wrong}; expected O and gradients in the input dtype {case.dtype}, "
                                 f"L in {' or '.join(map(str, lse_dtypes))}")
    ref, eager, mags = _references(case)
    group = f", ranks {list(case.members)} of {case.world_size}" if case.members else ""
    for key in ("O", "L", "dQ", "dK", "dV"):
        got = _unshard(results, key, case.layout).to(torch.float32 if key == "L" else case.dtype)
        dtype = torch.float32 if key == "L" else case.dtype
        oracle.assert_close(f"{key} (unsharded, W={case.group_size}{group}, {case.layout})", got, ref[key], eager[key], dtype,
                            magnitude=mags[key])


def check_ring_parity_delayed(subject, case):
    """Results are the same when every message arrives only when it is waited on (and a
    send reads its buffer only then).

    Source: torch.distributed's contract for isend / irecv and asynchronous collectives: a
    buffer may be read or modified only after its request's wait()."""
    check_ring_parity(subject, case, probe="delayed")


def check_subgroup_parity(subject, case):
    """On a subgroup whose group ranks are not its members' global ranks (ranks 1 and 3 of
    4, say), the ring over that group equals full attention on its sequence.

    Source: the protocol's ``group`` argument (any process group; torch's context
    parallelism runs on one dimension of a device mesh, a subgroup).  Code that takes group
    ranks for global ones (or the reverse) talks to the wrong ranks, or to none."""
    check_ring_parity(subject, case)


def _kv_bytes(case) -> int:
    elem = torch.empty((), dtype=case.dtype).element_size()
    return 2 * math.prod(case.batch) * case.n_local * case.d * elem


def _forward_traffic(log) -> tuple[int, int]:
    """(bytes taken in, bytes sent point to point) by one rank's forward."""
    taken = sum(e[4] for e in log if e[:3] == ("p2p", "forward", "recv"))
    taken += sum(e[3] for e in log if e[0] == "collective" and e[1] == "forward")
    sent = sum(e[4] for e in log if e[:3] == ("p2p", "forward", "send"))
    return taken, sent


def check_forward_traffic(subject, case):
    """No rank's forward takes in or sends more than the other ranks' K/V blocks once each:
    (W - 1) K/V blocks in the input dtype, plus a small metadata check.

    Source: none fixes the messages.  Ring Attention passes W - 1 K/V blocks to the next
    rank; torch's context parallelism all-gathers them (or rotates them by all-to-all);
    either moves (W - 1) blocks into every rank.  So the contract is the bound that
    protects the user: no more than that (a design that sends less, K/V a rank will not
    need under causal masking, passes); how and in which direction is free.  The exact ring
    is the extra ``forward_passes_w_minus_1_key_value_blocks_around_the_ring``."""
    results = _members(_on_ranks(rank.rank_ring, case, subject, case, "observe", False), case)
    W = case.group_size
    bound = (W - 1) * _kv_bytes(case) + METADATA_BYTES
    for r, res in enumerate(results):
        taken, sent = _forward_traffic(res["log"])
        if W > 1 and taken == 0 and sent == 0:
            raise NotApplicable("the forward moved no data this probe can observe (torch.distributed's point-to-point "
                                "calls and collectives): K/V travel by other means (functional collectives, a custom "
                                "kernel)")
        if taken > bound or sent > bound:
            raise AssertionError(f"rank {r}: forward took in {taken} and sent {sent} bytes; the other W - 1 = {W - 1} "
                                 f"ranks' K/V blocks are {(W - 1) * _kv_bytes(case)} bytes "
                                 f"(+ {METADATA_BYTES} for a metadata check)")


def check_forward_exchanges(subject, case):
    """The forward sends W - 1 K/V blocks to the next rank and receives W - 1 from the
    previous one, point to point; nothing else but a small metadata collective.

    Source: Ring Attention's own schedule (its Algorithm: W - 1 rotations to the next host).
    No contract fixes it (torch's ring all-gathers; a ring the other way round is the same
    ring): an extra, "ring exchanges as Ring Attention's"."""
    results = _members(_on_ranks(rank.rank_ring, case, subject, case, "observe", False), case)
    W = case.group_size
    for r, res in enumerate(results):
        log = res["log"]
        sends = [e for e in log if e[:3] == ("p2p", "forward", "send")]
        recvs = [e for e in log if e[:3] == ("p2p", "forward", "recv")]
        bad_peers = sorted({e[3] for e in sends if e[3] != (r + 1) % W} | {e[3] for e in recvs if e[3] != (r - 1) % W})
        if W > 1 and bad_peers:
            raise AssertionError(f"rank {r}: forward exchanged with rank(s) {bad_peers}; only {(r + 1) % W} (send) "
                                 f"and {(r - 1) % W} (receive) are its ring neighbours")
        expected = (W - 1) * _kv_bytes(case)
        sent, received = sum(e[4] for e in sends), sum(e[4] for e in recvs)
        if sent != expected or received != expected:
            raise AssertionError(f"rank {r}: forward sent {sent} and received {received} bytes point to point; "
                                 f"W - 1 = {W - 1} K/V blocks are {expected} bytes")
        coll = sum(e[3] for e in log if e[0] == "collective" and e[1] == "forward")
        if coll > METADATA_BYTES:
            raise AssertionError(f"rank {r}: forward took in {coll} bytes through collectives (at most {METADATA_BYTES}, "
                                 "a metadata check, is allowed)")


def _flops(log, phase):
    return sum(e[2] for e in log if e[0] == "flops" and e[1] == phase)


def _check_causal_flops(subject, case, allowed_pairs, what: str):
    results = _members(_on_ranks(rank.rank_ring, case, subject, case, "observe"), case)
    batch = math.prod(case.batch)
    for r, res in enumerate(results):
        allowed = allowed_pairs(case.group_size, r, case.layout, case.n_local) * batch * case.d
        fwd, bwd = _flops(res["log"], "forward"), _flops(res["log"], "backward")
        if fwd == 0:
            raise EnvironmentRefusal("the forward ran no torch matmul this law can count (a custom kernel); "
                                     "the causal-work law runs where the blocks are torch ops")
        if fwd > FWD_FLOPS_PER_PAIR * allowed:
            raise AssertionError(f"rank {r}: forward {fwd} FLOPs > {FWD_FLOPS_PER_PAIR}d per allowed pair "
                                 f"= {FWD_FLOPS_PER_PAIR * allowed}: {what} were computed")
        if bwd > BWD_FLOPS_PER_PAIR * allowed:
            raise AssertionError(f"rank {r}: backward {bwd} FLOPs > {BWD_FLOPS_PER_PAIR}d per allowed pair "
                                 f"= {BWD_FLOPS_PER_PAIR * allowed}: {what} were computed")


def check_causal_work(subject, case):
    """Under causal masking no rank computes a block of another rank's keys that its
    queries see nothing of: a rank's matmul FLOPs stay within 4d per pair forward and 12d
    backward over the other ranks' shards its queries see any key of (and its own).

    Source: skipping a fully masked block is what makes causal Ring Attention cheaper
    (Striped Attention, Brandon et al. 2023, and torch's ring both skip them); how finely
    partly masked blocks are cut is free, so the contract bounds FLOPs by whole blocks.
    Zigzag's half blocks are the extra ``causal_chunk_blocks_above_the_diagonal_are_never_computed``."""
    _check_causal_flops(subject, case, reference.shard_blocks_pairs, "blocks whose every key is after every query")


def check_causal_chunk_work(subject, case):
    """Under causal masking no (query chunk, key chunk) block entirely above the diagonal
    is computed: a rank's matmul FLOPs stay within 4d per pair forward and 12d backward on
    its diagonal block and the chunk blocks at or below the diagonal.

    Source: torch's ring and Llama 3's zigzag scheme compute, from each other rank, only
    the half of the zigzag block below the diagonal; no contract requires that granularity
    (a ring that computes partly masked blocks whole is correct and balanced): an extra."""
    _check_causal_flops(subject, case, reference.allowed_pairs, "chunk blocks above the causal diagonal")


def check_overlap(subject, case):
    """Every forward K/V exchange is in flight while a block is computed: some matmul runs
    between its start and the first wait on it.

    Source: Ring Attention overlaps passing K/V blocks with computing the current block
    (its point: communication hidden behind compute); torch's ring starts each rotation
    before computing.  Any exchange counts: point-to-point, or a collective called with
    async_op=True (an all-gather of K/V overlapped with the local block); exchanges smaller
    than a K or V shard (metadata) are not judged.  K/V moved only by blocking calls fail."""
    results = _members(_on_ranks(rank.rank_ring, case, subject, case, "observe", False), case)
    one_tensor = _kv_bytes(case) // 2
    for r, res in enumerate(results):
        log = [e for e in res["log"] if e[1] == "forward"]
        if not any(e[0] == "flops" for e in log):
            raise EnvironmentRefusal("the forward ran no torch matmul this law can see (a custom kernel)")
        starts = {e[2]: i for i, e in enumerate(log) if e[0] == "start" and e[3] >= one_tensor}
        waits = {e[2]: i for i, e in enumerate(log) if e[0] == "wait"}
        if case.group_size > 1 and not starts:
            taken, sent = _forward_traffic(res["log"])
            if taken or sent:
                raise AssertionError(f"rank {r}: the forward moved K/V only by blocking calls at W={case.group_size}: "
                                     "no exchange was in flight while a block was computed")
            raise NotApplicable("the forward moved no data this probe can observe (torch.distributed's "
                                "point-to-point calls and collectives)")
        for ident, i in starts.items():
            j = waits.get(ident, len(log))
            if not any(e[0] == "flops" for e in log[i:j]):
                raise AssertionError(f"rank {r}: exchange {ident} of the forward was waited on before any block was "
                                     "computed while it was in flight (no overlap of communication and compute)")


def check_no_nccl_hang(subject, case):
    """Forward and backward, every rank's point-to-point calls, played forward under NCCL's
    rules (``conformance.laws.p2p_hang``), complete: gloo buffers what NCCL makes wait.

    Source: NCCL's semantics for unbatched sends and receives; torch's contract on gloo
    allows them: an extra ("NCCL-safe exchanges")."""
    results = _members(_on_ranks(rank.rank_ring, case, subject, case, "observe"), case)
    why = first_hang({r: res["units"] for r, res in enumerate(results)})
    if why is not None:
        raise AssertionError(f"W={case.group_size}, {case.layout}: {why}")


def check_bad_input(subject, case):
    """Shards of different lengths on different ranks, and an odd zigzag shard, raise a
    clear error on every rank (any type; the words name a length, in tokens, elements or
    bytes) instead of hanging or computing.

    Source: none (torch's ring does not check; a check costs a collective per call): an
    extra, "clear errors for bad shards"."""
    n, d = case.n_local or 2, case.d
    results = _on_ranks(rank.rank_mismatched_lengths, case, subject, n, d)
    if case.world_size > 1:
        lengths = (n, n + 2)
        sizes = {x * per for x in lengths for per in (1, d)}
        sizes |= {m * s for s in set(sizes) for m in (2, 4, 8)}  # K and V together; bytes of float32
        for r, message in enumerate(results):
            require_clear_error(f"rank {r}: shards of lengths {n + 2} (rank 0) and {n} (the others)", message, sizes)
    results = _on_ranks(rank.rank_odd_zigzag, case, subject)
    for r, message in enumerate(results):
        require_clear_error(f"rank {r}: a zigzag shard of odd length 3", message, (3, 24, 48, 96, 192))
