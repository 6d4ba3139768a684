"""The layers import one way.

    impl                      torch, triton, numpy and itself: nothing of the suite
    suite mechanisms          (target protocol, verdicts and refusals, oracle and its margins,
                              profiles, harness, report, law and mutant types, compile clock,
                              capability table, accounting) no impl, no laws, no tests, no perf
    laws (conformance.laws)   mechanisms and impl (references); no tests, no perf
    adapters, mutants         targets: impl, mechanisms, laws; no tests, no perf
    spec cases, properties    tests: library modules only, never another test module
    perf                      anything; nothing imports perf

Every import statement counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("impl", "conformance", "properties", "perf")

MECHANISMS = {
    f"conformance.{name}"
    for name in (
        "__init__", "__main__", "target", "verdicts", "refusals", "oracle", "profiles", "harness",
        "harness_torchrun", "report", "lawbook", "compile_clock", "capabilities", "accounting", "isolation", "grade",
        "margins",
    )
}
TESTS = ("conformance.spec", "properties", "conformance.selftests")


def _under(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_of(module: str) -> str:
    if _under(module, ("impl",)):
        return "impl"
    if module in MECHANISMS or module == "conformance" or _under(module, ("conformance.accounting", "conformance.grading")):
        return "mechanism"
    if _under(module, ("conformance.laws",)):
        return "laws"
    if _under(module, ("conformance.adapters", "conformance.mutants")):
        return "target"
    if _under(module, ("conformance.spec", "properties")):
        return "test"
    if _under(module, ("conformance.selftests",)):
        return "selftest"
    if _under(module, ("perf",)):
        return "perf"
    return "conftest" if module == "conftest" else "unknown"


# layer -> the packages it must never import
FORBIDDEN = {
    "impl": ("conformance", "properties", "perf", "conftest"),
    "mechanism": ("impl", "properties", "perf", "conformance.laws", "conformance.spec", "conformance.selftests",
                  "conformance.mutants", "conformance.adapters"),
    "laws": ("properties", "perf", "conformance.spec", "conformance.selftests", "conformance.mutants"),
    "target": ("properties", "perf", "conformance.spec", "conformance.selftests"),
    "test": ("perf",) + TESTS,
    "selftest": ("perf", "conformance.spec", "properties"),
    "conftest": ("perf", "impl") + TESTS,
    "perf": (),
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(source: str, module: str) -> list[str]:
    """Absolute names of every module imported in ``source`` (relative imports resolved)."""
    names = []
    package = module if module.endswith("__init__") else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]  # "from pkg import module"
    return names


def violations(module: str, source: str) -> list[str]:
    layer = layer_of(module)
    bad = []
    for name in imports_of(source, module):
        if name == module or _under(name, (module,)):
            continue  # a module importing itself (case functions pickled by reference)
        if _under(name, FORBIDDEN.get(layer, ())):
            bad.append(f"{module} ({layer}) imports {name}")
    return sorted(set(bad))


def suite_modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield module_name(path), path
    yield "conftest", ROOT / "conftest.py"


def test_no_module_imports_across_the_wrong_direction():
    found = []
    for module, path in suite_modules():
        try:
            found += violations(module, path.read_text())
        except SyntaxError as exc:
            found.append(f"{module}: cannot be parsed ({exc})")
    assert not found, "imports against the layer order:\n" + "\n".join(found)


def test_every_module_belongs_to_a_layer():
    unknown = [m for m, _ in suite_modules() if layer_of(m) == "unknown"]
    assert not unknown, unknown


@pytest.mark.parametrize(
    "module, source",
    [
        ("impl.attention.flash_pytorch", "from conformance import oracle"),
        ("impl.ddp.base", "def f():\n    import perf.lib.measure\n"),
        ("conformance.oracle", "from impl.attention.reference import attention_scores"),
        ("conformance.harness", "from conformance.laws.ddp import laws"),
        ("conformance.laws.ddp.rank", "from properties import test_ddp"),
        ("properties.test_ddp", "from conformance.spec.test_ddp import BUCKET_SIZES_MB"),
        ("conformance.spec.test_attention", "from properties.test_attention import FLAVOURS"),
        ("conformance.mutants.ddp", "from perf.bench import ddp"),
        ("conformance.laws.zero.laws", "from perf.lib.accounting import optimizer_state_bytes"),
        ("impl.zero", "from ..perf import x"),
    ],
)
def test_an_import_in_the_wrong_direction_is_found(module, source):
    """The checker has teeth: each of these imports breaks the layer order and is reported."""
    assert violations(module, source), f"{module}: {source!r} was not reported"


def test_imports_in_the_right_direction_pass():
    assert not violations("conformance.laws.ddp.rank", "from impl.ddp import BucketedDDP\nfrom conformance import oracle")
    assert not violations("perf.bench.ddp", "from conformance.harness import run_on_ranks\nfrom impl.ddp import BucketedDDP")
    assert not violations("conformance.selftests.test_harness", "from conformance.selftests.test_harness import identity")
