"""Data-parallel training laws: random models and cases, rank-side case functions, checks.

Flavours
    A target offers up to three DDP flavours through the CS336 adapter names:
    ``individual`` (2025 get_ddp_individual_parameters), ``bucketed`` (2025
    get_ddp_bucketed with a bucket size) and ``ddp2026`` (get_ddp).  A flavour whose
    factory is missing or raises NotImplementedError is "not offered".

How a case runs
    The test draws a small description (``TrainingCase``: model shape, world size, per-step
    and per-rank batch splits, optimizer, precision, a seed), sends it to every rank with
    ``conformance.harness.run_on_ranks`` together with the target's spec string, and the
    ranks rebuild model and data from the seed.  Rank r > 0 initialises its model from a
    different seed (and different buffers), so only a wrapper that broadcasts rank 0's
    state can pass.  The ranks return plain tensors; every comparison runs in the test
    process, where the single-process references are computed too.

Loss scaling (why the comparison is exact in law)
    A step's global batch of B rows is split unevenly over ranks (and micro-batches).
    Each rank's loss is ``world_size / B * sum(per-row losses of its rows)``; averaging
    the ranks' gradients then gives the gradient of ``1/B * sum(all per-row losses)``,
    the full-batch mean loss that the single-process reference minimises.  (Per-rank
    *mean* losses would weight the rows of small splits more; they agree only for equal
    splits.)

What "matches a single process" means (the oracle)
    ref64  the single process trained on the whole batch in float64, from rank 0's
           initial values (rounded to float32 first, so it sees the inputs DDP sees);
    eager  the same single-process run in the tested precision (float32, or float32
           parameters under bf16 autocast), on the same device.
    A correct data-parallel step is the eager step up to the order in which per-row
    contributions are added (per-rank partial sums, then the all-reduce) and one
    division by the world size: reorderings that change the rounding, not its size.  So
    the synchronised gradients of every step must pass ``oracle.judge`` against ref64
    with the eager run's error as the yardstick and, as the rounding floor, the
    magnitudes of the terms each gradient element sums (|dY|^T |X| per Linear: a sum
    that cancels is judged against the size of what cancelled, whatever the order).
    In float32 the final parameters must pass too (their own rounding dominates there);
    under bf16 autocast the gradients are the check (see check_matches_single_process).
    Adam and AdamW run with eps=1e-2 so that their update is a smooth function of the
    gradient at rounding scale (with eps -> 0 it is sign-like, and rounding noise on a
    gradient element near zero turns into an lr-sized jump that no precision argument
    bounds).

Laws (the checks below; ``properties/test_ddp.py`` runs them under Hypothesis)
    replicas   right after wrapping every rank holds rank 0's parameters and buffers;
               after every synced step all ranks hold bit-identical gradients (None in the
               same places) and, at the end, bit-identical parameters and buffers;
    matches    the gradients of every step (None exactly where the single process has
               None) and the final parameters match the single-process run on the whole
               batch (oracle);
    no_sync    m micro-batches under ``no_sync()`` then one synced backward equal one step
               on the concatenated batch, nothing is reduced inside ``no_sync()``, and a
               plain step after it is still right (bookkeeping not stale);
    layout     ``.buckets`` partitions exactly the parameters that require grad (tied ones
               once), in reverse registration order, each bucket at most the cap unless
               it holds a single larger parameter;
    overlap    at least one gradient collective is issued during the backward pass while
               gradients are still being produced (observed: ``torch.distributed``'s
               reducing collectives are wrapped in the rank process, and hooks registered
               before wrapping log each gradient as it becomes ready).
"""
