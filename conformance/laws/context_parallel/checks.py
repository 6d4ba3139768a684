"""Comparisons: each ``check_*`` takes the subject (a target spec string) and a case, and
raises AssertionError when the target breaks the law (a verdict when it cannot be checked
here).  Ranks run ``rank.py``'s functions; references come from ``reference.py``; every
tolerance comes from ``conformance.oracle``."""

from __future__ import annotations

import math

import torch

from conformance import oracle
from conformance.harness import run_on_ranks
from conformance.laws.context_parallel import rank, reference
from conformance.laws.p2p_hang import first_hang
from conformance.target import load_target
from conformance.verdicts import EnvironmentRefusal

CASE_TIMEOUT_S = 120.0
METADATA_BYTES = 1024  # collectives a forward may issue besides its ring: a shape check at most
FWD_FLOPS_PER_PAIR = 4  # x d: S = Q K^T and P V, 2 d each (FlashAttention-2)
BWD_FLOPS_PER_PAIR = 10  # x d: S, dV, dP, dQ, dK recomputed / accumulated once per pair


def _target(subject):
    return load_target(subject)


def _on_ranks(fn, case, *args):
    return run_on_ranks(fn, case.world_size, *args, timeout=CASE_TIMEOUT_S)


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
    full attention's O and L (fully masked blocks included)."""
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
    (0, -inf) with no NaN; any two partials merge to finite values where either is finite."""
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
    is a ValueError."""
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
        try:
            shard(bad, W, 0, case.layout, case.dim)
        except ValueError:
            pass
        else:
            raise AssertionError(f"sharding length {bad.shape[case.dim]} into {pieces} {case.layout} chunks did not raise ValueError")


def check_positions(subject, case):
    """A rank's RoPE positions are the slice of the full sequence's positions its shard
    holds: RoPE of the shard at those positions is the shard of RoPE of the whole."""
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
    (query, key) pairs."""
    positions = _target(subject).factory("context_parallel_positions")
    n, W = case.seq_len, case.world_size
    pairs = [reference.causal_pairs(torch.as_tensor(positions(n, W, r, "zigzag")).cpu().long()) for r in range(W)]
    covered = sorted(int(p) for r in range(W) for p in torch.as_tensor(positions(n, W, r, "zigzag")).tolist())
    if covered != list(range(n)):
        raise AssertionError(f"zigzag positions over W={W} do not cover 0..{n - 1} once each")
    if len(set(pairs)) != 1:
        raise AssertionError(f"zigzag (W={W}, N={n}): attended pairs per rank {pairs} differ")


# --- ring ------------------------------------------------------------------------------------


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


def check_ring_parity(subject, case, probe: str = "none"):
    """Unsharded O, L and dQ, dK, dV equal single-process attention on the whole sequence
    (oracle tolerance)."""
    results = _on_ranks(rank.rank_ring, case, subject, case, probe)
    lse_dtype = torch.float64 if case.dtype == torch.float64 else torch.float32
    for r, res in enumerate(results):
        wrong = {key: res[key].dtype for key in ("O", "dQ", "dK", "dV") if res[key].dtype != case.dtype}
        if res["L"].dtype != lse_dtype:
            wrong["L"] = res["L"].dtype
        if wrong:
            raise AssertionError(f"rank {r}: dtypes {wrong}; expected O and gradients in the input dtype {case.dtype}, "
                                 f"L in {lse_dtype}")
    ref, eager, mags = _references(case)
    for key in ("O", "L", "dQ", "dK", "dV"):
        got = _unshard(results, key, case.layout)
        dtype = torch.float32 if key == "L" else case.dtype
        oracle.assert_close(f"{key} (unsharded, W={case.world_size}, {case.layout})", got, ref[key], eager[key], dtype,
                            magnitude=mags[key])


def check_ring_parity_delayed(subject, case):
    """Results are the same when every message arrives only when it is waited on (and a
    send reads its buffer only then)."""
    check_ring_parity(subject, case, probe="delayed")


def _kv_bytes(case) -> int:
    elem = torch.empty((), dtype=case.dtype).element_size()
    return 2 * math.prod(case.batch) * case.n_local * case.d * elem


def check_forward_exchanges(subject, case):
    """The forward sends W - 1 K/V blocks to the next rank and receives W - 1 from the
    previous one, point to point; nothing else but a small metadata collective."""
    results = _on_ranks(rank.rank_ring, case, subject, case, "observe", False)
    W = case.world_size
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
            raise AssertionError(f"rank {r}: forward moved {coll} bytes through collectives (at most {METADATA_BYTES}, "
                                 "a metadata check, is allowed)")


def _flops(log, phase):
    return sum(e[2] for e in log if e[0] == "flops" and e[1] == phase)


def check_causal_work(subject, case):
    """Under causal masking no block entirely above the diagonal is computed: a rank's
    matmul FLOPs stay within FlashAttention-2's per pair (4d forward, 10d backward) on
    its diagonal block and the chunk blocks at or below the diagonal."""
    results = _on_ranks(rank.rank_ring, case, subject, case, "observe")
    batch = math.prod(case.batch)
    for r, res in enumerate(results):
        allowed = reference.allowed_pairs(case.world_size, r, case.layout, case.n_local) * batch * case.d
        fwd, bwd = _flops(res["log"], "forward"), _flops(res["log"], "backward")
        if fwd == 0:
            raise EnvironmentRefusal("the forward ran no torch matmul this law can count (a custom kernel); "
                                     "the causal-work law runs where the blocks are torch ops")
        if fwd > FWD_FLOPS_PER_PAIR * allowed:
            raise AssertionError(f"rank {r}: forward {fwd} FLOPs > {FWD_FLOPS_PER_PAIR}d per allowed pair "
                                 f"= {FWD_FLOPS_PER_PAIR * allowed}: blocks above the causal diagonal were computed")
        if bwd > BWD_FLOPS_PER_PAIR * allowed:
            raise AssertionError(f"rank {r}: backward {bwd} FLOPs > {BWD_FLOPS_PER_PAIR}d per allowed pair "
                                 f"= {BWD_FLOPS_PER_PAIR * allowed}: blocks above the causal diagonal were computed")


def check_overlap(subject, case):
    """Every forward K/V exchange is in flight while a block is computed: some matmul runs
    between its start and the first wait on it."""
    results = _on_ranks(rank.rank_ring, case, subject, case, "observe", False)
    for r, res in enumerate(results):
        log = [e for e in res["log"] if e[1] == "forward"]
        if not any(e[0] == "flops" for e in log):
            raise EnvironmentRefusal("the forward ran no torch matmul this law can see (a custom kernel)")
        starts = {e[2]: i for i, e in enumerate(log) if e[0] == "start"}
        waits = {e[2]: i for i, e in enumerate(log) if e[0] == "wait"}
        if case.world_size > 1 and not starts:
            raise AssertionError(f"rank {r}: no point-to-point exchange observed in the forward at W={case.world_size}")
        for ident, i in starts.items():
            j = waits.get(ident, len(log))
            if not any(e[0] == "flops" for e in log[i:j]):
                raise AssertionError(f"rank {r}: exchange {ident} of the forward was waited on before any block was "
                                     "computed while it was in flight (no overlap of communication and compute)")


def check_no_nccl_hang(subject, case):
    """Forward and backward, every rank's point-to-point calls, played forward under NCCL's
    rules (``conformance.laws.p2p_hang``), complete: gloo buffers what NCCL makes wait."""
    results = _on_ranks(rank.rank_ring, case, subject, case, "observe")
    why = first_hang({r: res["units"] for r, res in enumerate(results)})
    if why is not None:
        raise AssertionError(f"W={case.world_size}, {case.layout}: {why}")


def check_bad_input(subject, case):
    """Shards of different lengths on different ranks, and an odd zigzag shard, raise a
    clear error on every rank instead of hanging or computing."""
    results = _on_ranks(rank.rank_mismatched_lengths, case, subject, case.n_local or 2, case.d)
    if case.world_size > 1:
        silent = [r for r, msg in enumerate(results) if msg is None]
        if silent:
            raise AssertionError(f"rank(s) {silent} accepted shards of different lengths on different ranks")
    results = _on_ranks(rank.rank_odd_zigzag, case, subject)
    silent = [r for r, msg in enumerate(results) if msg is None]
    if silent:
        raise AssertionError(f"rank(s) {silent} accepted an odd local length under the zigzag layout")
