"""Which CS336 assignment 2 release a ``tests/adapters.py`` follows, from the names it defines.

The course renamed its DDP adapters between releases (``conformance/target.py`` lists both):
2025 has ``get_ddp_individual_parameters`` and ``get_ddp_bucketed``, 2026 has ``get_ddp`` and
the FSDP adapters.  A 2025 file with FSDP added by its author is still a 2025 file: the 2025
names decide first.
"""

from __future__ import annotations

import ast

RELEASE_2025 = ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward",
                "get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start")
RELEASE_2026 = ("get_ddp", "ddp_on_after_backward", "get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params")


def defined_functions(source: str) -> list[str]:
    """Names of the module-level functions of ``source`` (empty if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def release_of_adapters(source: str) -> str | None:
    """"2025", "2026", or None when the file names neither release's DDP adapters."""
    names = set(defined_functions(source))
    if names & set(RELEASE_2025):
        return "2025"
    if names & set(RELEASE_2026):
        return "2026"
    return None
