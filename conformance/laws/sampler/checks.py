"""The comparisons behind the sampler laws (in the test's own process: no ranks needed).

Every check builds the target's sampler once per rank (``get_distributed_sampler(N, R,
r, shuffle, seed, drop_last)``, ``set_epoch(epoch)``) and reads the shares.

What fixes each quantity.  torch's ``DistributedSampler`` documents: each process loads "a
subset of the original dataset that is exclusive to it"; ``drop_last`` "drop[s] the tail of
the data to make it evenly divisible across the number of replicas", otherwise the sampler
"add[s] extra indices to make the data evenly divisible"; the seed "should be identical
across all processes"; ``set_epoch`` makes "all replicas use a different random ordering for
each epoch", and without shuffling "the next iteration of this sampler will yield the same
ordering"; a rank outside [0, num_replicas - 1] is a ValueError.  So the contract checks
(``check_cover``, ``check_len``, ``check_epochs``, ``check_unshuffled``,
``check_reused_sampler``) hold every rank to

    L = floor(N / R) under drop_last (N % R != 0), else ceil(N / R), the same on every rank;
    T = R * L; without drop_last the ranks together see every index of range(N) at least
    once and T indices in all (the T - N extra ones are indices of range(N)); with drop_last
    T distinct indices of range(N);

and leave free what torch's documentation does not state: WHICH indices pad, and how the
order is cut into shares.  torch's own choices -- the padded order is the order followed by
its first T - N entries again (cycling when T - N > N), and rank r takes positions r, r + R,
r + 2R, ... of it -- are the extra "torch's partition and padding" (``check_torch_padding``,
``check_strided``).
"""

from __future__ import annotations

import math
import re

from conformance.target import load_target


def expected_len(case) -> int:
    n, r = case.dataset_len, case.num_replicas
    return n // r if case.drop_last and n % r else math.ceil(n / r)


def shares(subject, case, epoch=None, fresh_per_rank=True) -> list[list[int]]:
    make = load_target(subject).factory("get_distributed_sampler")
    out = []
    for rank in range(case.num_replicas):
        sampler = make(case.dataset_len, case.num_replicas, rank, shuffle=case.shuffle, seed=case.seed, drop_last=case.drop_last)
        sampler.set_epoch(case.epoch if epoch is None else epoch)
        out.append([int(i) for i in sampler])
    return out


def interleave(per_rank: list[list[int]]) -> list[int]:
    length = max((len(s) for s in per_rank), default=0)
    return [s[i] for i in range(length) for s in per_rank if i < len(s)]


def _where(case) -> str:
    return (f"N={case.dataset_len} R={case.num_replicas} shuffle={case.shuffle} seed={case.seed} "
            f"epoch={case.epoch} drop_last={case.drop_last}")


def check_cover(subject, case) -> None:
    """Across ranks every index is seen at least once per epoch, with T - N extra indices
    of range(N) padding the shares to equal lengths (which ones: the target's choice), or,
    with drop_last, T distinct indices (torch's DistributedSampler contract)."""
    per_rank = shares(subject, case)
    n, L = case.dataset_len, expected_len(case)
    t = L * case.num_replicas
    lens = [len(s) for s in per_rank]
    if lens != [L] * case.num_replicas:
        raise AssertionError(f"{_where(case)}: shares of lengths {lens}, the rule says {L} each")
    seen = [i for s in per_rank for i in s]
    if any(not 0 <= i < n for i in seen):
        raise AssertionError(f"{_where(case)}: index out of range(N) in {per_rank}")
    if case.drop_last:
        if len(set(seen)) != t:
            raise AssertionError(f"{_where(case)}: with drop_last the {t} indices must be distinct, got {per_rank}")
        return
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise AssertionError(f"{_where(case)}: indices {missing} are on no rank this epoch (ranks disagree on the "
                             f"order, or an index is lost): shares {per_rank}")


def check_torch_padding(subject, case) -> None:
    """torch's padding (an extra: its documentation says only that extra indices are added):
    interleaving the shares (position i*R + r holds rank r's i-th index) gives a permutation
    of range(N) followed by its first T - N entries again, cycling when T - N > N."""
    check_cover(subject, case)
    if case.drop_last:
        return
    padded = interleave(shares(subject, case))
    n = case.dataset_len
    head, tail = padded[:n], padded[n:]
    if sorted(head) != list(range(n)):
        raise AssertionError(f"{_where(case)}: the first N of the interleaved shares are not a permutation of "
                             f"range(N) (torch's strided shares give one): {padded}")
    want_tail = (head * math.ceil(len(tail) / n))[: len(tail)] if n else []
    if tail != want_tail:
        raise AssertionError(f"{_where(case)}: padding {tail}, torch repeats the start of the order: {want_tail}")


def check_len(subject, case) -> None:
    """len(sampler) is ceil(N / R), or floor(N / R) with drop_last, and equals what it yields
    (torch's contract: the data made "evenly divisible" by adding extra indices or dropping
    the tail, so every rank yields as many as len() says)."""
    make = load_target(subject).factory("get_distributed_sampler")
    want = expected_len(case)
    for rank in range(case.num_replicas):
        s = make(case.dataset_len, case.num_replicas, rank, shuffle=case.shuffle, seed=case.seed, drop_last=case.drop_last)
        s.set_epoch(case.epoch)
        got, n_yielded = len(s), len(list(s))
        if got != want or n_yielded != want:
            raise AssertionError(f"{_where(case)} rank {rank}: len() {got}, yields {n_yielded}, the rule says {want}")


def check_epochs(subject, case) -> None:
    """The same seed and epoch give the same shares (fresh samplers); another epoch gives
    another order (N >= 12: a uniform shuffle repeats an order with probability < 2.1e-9).
    torch's contract: the seed is the same on every process, and set_epoch makes "all
    replicas use a different random ordering for each epoch"."""
    first = interleave(shares(subject, case))
    again = interleave(shares(subject, case))
    if first != again:
        raise AssertionError(f"{_where(case)}: two samplers with the same seed and epoch disagree: {first} vs {again}")
    other = interleave(shares(subject, case, epoch=case.epoch + 1))
    if other == first:
        raise AssertionError(f"{_where(case)}: epochs {case.epoch} and {case.epoch + 1} give the same order {first}: "
                             "set_epoch is ignored")


def check_strided(subject, case) -> None:
    """torch's partition (an extra): without shuffling rank r gets r, r + R, r + 2R, ... of
    the padded order 0..N-1."""
    per_rank = shares(subject, case)
    n, r_ = case.dataset_len, case.num_replicas
    t = expected_len(case) * r_
    base = list(range(n))
    padded = base[:t] if case.drop_last else (base * max(1, math.ceil(t / max(n, 1))))[:t] if n else []
    for rank, got in enumerate(per_rank):
        want = padded[rank:t:r_]
        if got != want:
            raise AssertionError(f"{_where(case)} rank {rank}: {got}, the strided order is {want}")


def _increasing_runs(share: list[int]) -> int:
    return sum(1 for i, x in enumerate(share) if i == 0 or x < share[i - 1])


def check_unshuffled(subject, case) -> None:
    """Without shuffling nothing is reordered: the shares are the same for every seed and
    epoch (torch: "the next iteration ... will yield the same ordering"), and each share
    keeps the dataset's order -- one increasing run, or two where padding wraps round to
    the start (torch's documented "shuffle=False"; which rank holds which part is free)."""
    per_rank = shares(subject, case)
    other = type(case)(case.dataset_len, case.num_replicas, case.shuffle, case.seed + 1, case.epoch, case.drop_last)
    later = shares(subject, other, epoch=case.epoch + 3)
    if later != per_rank:
        raise AssertionError(f"{_where(case)}: without shuffling, seed {case.seed + 1} at epoch {case.epoch + 3} gives "
                             f"{later}, not {per_rank}: the order moved")
    runs = 1 if case.drop_last or case.dataset_len % case.num_replicas == 0 else 2
    for rank, share in enumerate(per_rank):
        if _increasing_runs(share) > runs:
            raise AssertionError(f"{_where(case)} rank {rank}: share {share} is not in the dataset's order "
                                 f"(at most {runs} increasing run{'s' if runs > 1 else ''}{' with the padding' if runs > 1 else ''})")


def check_reused_sampler(subject, case) -> None:
    """One sampler object per rank, kept across epochs as a training loop keeps it:
    ``set_epoch(e)`` then iterating gives the shares fresh samplers give at epoch e, for
    three epochs in a row (a share computed once and cached ignores set_epoch)."""
    make = load_target(subject).factory("get_distributed_sampler")
    kept = [make(case.dataset_len, case.num_replicas, rank, shuffle=case.shuffle, seed=case.seed,
                 drop_last=case.drop_last) for rank in range(case.num_replicas)]
    for epoch in (case.epoch, case.epoch + 1, case.epoch + 2):
        got = []
        for sampler in kept:
            sampler.set_epoch(epoch)
            got.append([int(i) for i in sampler])
        want = shares(subject, case, epoch=epoch)
        if got != want:
            raise AssertionError(f"{_where(case)}: after set_epoch({epoch}) the samplers kept since epoch "
                                 f"{case.epoch} give {interleave(got)}, fresh ones {interleave(want)}")


def check_seed(subject, case) -> None:
    """Another seed, same epoch: another order (N >= 12, as for epochs)."""
    first = interleave(shares(subject, case))
    other_case = type(case)(case.dataset_len, case.num_replicas, case.shuffle, case.seed + 1, case.epoch, case.drop_last)
    if interleave(shares(subject, other_case)) == first:
        raise AssertionError(f"{_where(case)}: seeds {case.seed} and {case.seed + 1} give the same order {first}: "
                             "the seed is ignored")


DROP_EPOCHS = 8  # one index dropped of N >= 12: the same one in 8 epochs with probability < 12**-7


def check_dropped_tail(subject, case) -> None:
    """With drop_last and shuffling, the dropped indices are the tail of each epoch's order,
    so they change between epochs (dropping the same indices every epoch means some
    examples are never trained on)."""
    n = case.dataset_len
    dropped = []
    for epoch in range(case.epoch, case.epoch + DROP_EPOCHS):
        seen = set(interleave(shares(subject, case, epoch=epoch)))
        dropped.append(frozenset(range(n)) - seen)
    if len(set(dropped)) == 1 and dropped[0]:
        raise AssertionError(f"{_where(case)}: epochs {case.epoch}..{case.epoch + DROP_EPOCHS - 1} all drop the same "
                             f"indices {sorted(dropped[0])}: they are never seen")


def check_bad_rank(subject, case) -> None:
    """A rank outside [0, R) is refused with a ValueError that names the rank -- the word,
    or the offending value -- when the sampler is made (rank R would otherwise read
    positions past every other rank's).  torch raises ValueError there; the wording is free."""
    make = load_target(subject).factory("get_distributed_sampler")
    for rank in (case.num_replicas, -1, case.num_replicas + case.seed % 5):
        try:
            make(case.dataset_len, case.num_replicas, rank, shuffle=case.shuffle, seed=case.seed, drop_last=case.drop_last)
        except ValueError as exc:
            said = str(exc).lower()
            if "rank" not in said and not re.search(rf"(?<![\d.]){rank}(?![\d.])", said):
                raise AssertionError(f"{_where(case)} rank {rank}: ValueError({exc!s}) names neither the rank nor {rank}") from exc
            continue
        raise AssertionError(f"{_where(case)}: rank {rank} of {case.num_replicas} replicas was accepted")
