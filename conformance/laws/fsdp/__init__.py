"""The FSDP laws: random models, cases, rank-side runs, the single-process reference, checks.

    model       the random models (Embedding, Linear, RMSNorm: CS336's shapes), data
    strategies  the cases (Hypothesis strategies, pure functions of their arguments)
    spy         torch.distributed's collectives wrapped in the rank: dtypes, phases, delays
    memory      what a rank holds: storages reachable from the model and optimizer
    rank        the module-level functions run on ranks
    reference   one process, the same reduction order as the ranks, float64 twin
    checks      the comparisons
    laws        LAWS (the Law table) and the mutant runner ``rejection``
"""
