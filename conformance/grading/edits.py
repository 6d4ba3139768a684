"""The course's tests a repository edited: its ``tests/`` against the official versions.

Compared as syntax trees, not text: reformatting, comments, docstrings and assertion
messages are no edit.  Each finding names the file, the test (or helper, fixture, adapter),
what changed, the official code before and the repository's after:

    test deleted / renamed / disabled by renaming (to a name pytest does not collect)
    skip added, xfail added (a decorator, a ``pytestmark``, a ``pytest.skip`` call)
    exact comparison made a tolerance (``torch.equal`` or ``==`` -> ``allclose``, ...)
    tolerance widened (a larger atol / rtol / abs / rel, or a larger bound in ``x < tol``)
    assertion removed, assertion changed, assertion tightened, early return added
    parametrized cases removed, parametrization changed
    fixture changed or removed, helper changed, test body changed, module code changed,
    imports changed (compared as sets: their order is no edit)
    test file deleted (a ``test_*.py`` or a data file), course file deleted (``conftest.py``,
    ``common.py``), fixture data changed (bytes under ``tests/``)
    adapter missing, adapter signature changed (``adapters.py``: its bodies are the
    student's to write, so only the course's names and parameters are compared)

``weakens`` marks the findings that can let a wrong solution pass a course test.  A file is
compared with every official version of it (``conformance.grading.official``) and judged
against the nearest: equal to any one of them, it is not edited.
"""

from __future__ import annotations

import ast
import copy
import difflib
from dataclasses import asdict, dataclass
from pathlib import Path

from conformance.grading.official import Official, blob_id

TEST_DELETED = "test deleted"
TEST_RENAMED = "test renamed"
TEST_DISABLED = "test disabled by renaming"
SKIP_ADDED = "skip added"
XFAIL_ADDED = "xfail added"
EXACT_TO_TOLERANCE = "exact comparison made a tolerance"
TOLERANCE_WIDENED = "tolerance widened"
ASSERTION_REMOVED = "assertion removed"
ASSERTION_CHANGED = "assertion changed"
ASSERTION_TIGHTENED = "assertion tightened"
IMPORTS_CHANGED = "imports changed"
EARLY_RETURN = "early return added"
CASES_REMOVED = "parametrized cases removed"
PARAMETRIZE_CHANGED = "parametrization changed"
FIXTURE_CHANGED = "fixture changed"
FIXTURE_REMOVED = "fixture removed"
HELPER_CHANGED = "helper changed"
HELPER_REMOVED = "helper removed"
TEST_CHANGED = "test body changed"
MODULE_CHANGED = "module code changed"
FILE_DELETED = "test file deleted"
COURSE_FILE_DELETED = "course file deleted"
DATA_CHANGED = "fixture data changed"
ADAPTER_MISSING = "adapter missing"
ADAPTER_SIGNATURE = "adapter signature changed"
UNPARSABLE = "file does not parse"

WEAKENING = {TEST_DELETED, TEST_DISABLED, SKIP_ADDED, XFAIL_ADDED, EXACT_TO_TOLERANCE, TOLERANCE_WIDENED,
             ASSERTION_REMOVED, EARLY_RETURN, CASES_REMOVED, FILE_DELETED, DATA_CHANGED}

SHOWN = 240  # characters of code shown before and after


@dataclass
class Edit:
    file: str
    test: str
    kind: str
    before: str
    after: str
    line: int = 0  # in the repository's file (0: none there)
    official: str = ""  # the official version compared against

    @property
    def weakens(self) -> bool:
        return self.kind in WEAKENING

    def as_dict(self) -> dict:
        return dict(asdict(self), weakens=self.weakens)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where} {self.test or '(module)'}: {self.kind}: `{self.before}` -> `{self.after}`"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _src(node) -> str:
    if node is None:
        return "(none)"
    if isinstance(node, list):
        return _short("; ".join(ast.unparse(n) for n in node)) if node else "(none)"
    return _short(ast.unparse(node))


# --- normal form: what an edit is not ---------------------------------------------------------

def _strip_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


class _Normal(ast.NodeTransformer):
    """No docstrings, no assertion messages: neither changes what a test checks."""

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.body = _strip_docstring(node.body)
        if isinstance(node, ast.Assert):
            node.msg = None
        return node


def normal(node) -> ast.AST:
    return _Normal().visit(copy.deepcopy(node))


def dump(node) -> str:
    return ast.dump(normal(node))


# --- checks: assertions and assertion calls, in source order ----------------------------------

EXACT_CALLS = {"equal", "array_equal", "assert_equal", "assert_array_equal", "assertEqual", "assertListEqual", "assertTupleEqual"}
TOLERANCE_CALLS = {"allclose", "isclose", "assert_close", "assert_allclose", "approx", "assert_almost_equal",
                   "assert_array_almost_equal", "assertAlmostEqual"}
# the tolerance a call gives when it names none (torch and numpy docs; assert_close: float32)
DEFAULT_TOLERANCE = {
    "allclose": {"rtol": 1e-5, "atol": 1e-8}, "isclose": {"rtol": 1e-5, "atol": 1e-8},
    "assert_close": {"rtol": 1.3e-6, "atol": 1e-5}, "assert_allclose": {"rtol": 1e-7, "atol": 0.0},
    "approx": {"rel": 1e-6, "abs": 1e-12}, "assert_almost_equal": {"decimal": 7}, "assert_array_almost_equal": {"decimal": 6},
    "assertAlmostEqual": {"places": 7},
}
POSITIONAL_TOLERANCE = {"allclose": ("rtol", "atol"), "isclose": ("rtol", "atol"), "assert_allclose": ("rtol", "atol"),
                        "approx": ("rel", "abs")}
FIRST_TOLERANCE_ARG = {"allclose": 2, "isclose": 2, "assert_allclose": 2, "approx": 1}
TIGHTER_WHEN_LARGER = {"decimal", "places"}


def _call_name(node) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_check(node) -> bool:
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Call):
        name = _call_name(node)
        return name.startswith("assert") or name in ("raises", "warns")
    return False


def checks_of(node) -> list:
    """The checks inside ``node`` in source order (a check's own inner calls are not more checks)."""
    found = []

    def visit(n):
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue  # a nested definition is compared on its own
            if _is_check(child):
                found.append(child)
            else:
                visit(child)

    visit(node)
    return found


def _number(node) -> float | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def style_of(check) -> tuple[str, dict]:
    """("exact" | "tolerance" | "other", {tolerance name: value}) of one check."""
    calls = [n for n in ast.walk(check) if isinstance(n, ast.Call)]
    for call in calls:
        name = _call_name(call)
        if name in TOLERANCE_CALLS:
            tol = dict(DEFAULT_TOLERANCE.get(name, {}))
            start = FIRST_TOLERANCE_ARG.get(name)
            if start is not None:
                for key, arg in zip(POSITIONAL_TOLERANCE.get(name, ()), call.args[start:]):
                    tol[key] = _number(arg)
            for kw in call.keywords:
                if kw.arg in ("atol", "rtol", "abs", "rel", "decimal", "places", "delta"):
                    tol[kw.arg] = _number(kw.value)
            return "tolerance", tol
    if any(_call_name(c) in EXACT_CALLS for c in calls):
        return "exact", {}
    test = check.test if isinstance(check, ast.Assert) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, right = test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            return "exact", {}
        bound = _number(right) if isinstance(op, (ast.Lt, ast.LtE)) else _number(test.left) if isinstance(op, (ast.Gt, ast.GtE)) else None
        if bound is not None:
            return "tolerance", {"bound": bound}
    return "other", {}


def compare_checks(before, after) -> str:
    """The kind of change from one official check to the repository's check in its place."""
    sb, tb = style_of(before)
    sa, ta = style_of(after)
    if sb == "exact" and sa == "tolerance":
        return EXACT_TO_TOLERANCE
    if sb == "tolerance" and sa == "exact":
        return ASSERTION_TIGHTENED
    if sb == "tolerance" and sa == "tolerance":
        wider = tighter = False
        for key in set(tb) | set(ta):
            b, a = tb.get(key), ta.get(key)
            if b is None or a is None or a == b:
                continue
            if (a < b) if key in TIGHTER_WHEN_LARGER else (a > b):
                wider = True
            else:
                tighter = True
        if wider:
            return TOLERANCE_WIDENED
        if tighter:
            return ASSERTION_TIGHTENED
    return ASSERTION_CHANGED


# --- functions --------------------------------------------------------------------------------

def _decorator_kind(dec) -> str:
    text = ast.unparse(dec)
    for kind in ("skipif", "skip", "xfail", "parametrize", "fixture"):
        if f".{kind}" in text or text.startswith(kind):
            return kind
    return "other"


def _is_fixture(fn) -> bool:
    return any(_decorator_kind(d) == "fixture" for d in getattr(fn, "decorator_list", ()))


def _is_test_name(name: str) -> bool:
    return name.split(".")[-1].startswith("test")


def definitions(tree: ast.Module) -> dict:
    """qualified name -> node: module functions, each class's methods ("Class.method"), and
    each class other than ``Test*`` with its methods taken out (its bases and attributes)."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if not node.name.startswith("Test"):
                shell = copy.copy(node)
                shell.body = [n for n in node.body if n not in methods] or [ast.Pass()]
                out[node.name] = shell
            for item in methods:
                out[f"{node.name}.{item.name}"] = item
    return out


def _body_dump(fn) -> str:
    """The function with its name blanked: equal for a test that was only renamed."""
    fn = copy.deepcopy(fn)
    fn.name = "_"
    return dump(fn)


def _calls_to(node, names) -> list:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and _call_name(n) in names
            and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == "pytest"]


def _bare_returns(fn) -> int:
    count = 0

    def visit(n):
        nonlocal count
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Return) and child.value is None:
                count += 1
            visit(child)

    visit(fn)
    return count


class _BlankChecks(ast.NodeTransformer):
    """Checks, imports, bare returns and decorators out of the way (each compared on its
    own): what is left differs only if more than they changed.  A block left empty reads
    ``...``."""

    def visit_Assert(self, node):
        return None

    def visit_Import(self, node):
        return None

    visit_ImportFrom = visit_Import

    def visit_Expr(self, node):
        return None if _is_check(node.value) else self.generic_visit(node)

    def visit_Return(self, node):
        return None if node.value is None else self.generic_visit(node)

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if isinstance(getattr(node, "body", None), list) and not node.body:
            node.body = [ast.copy_location(ast.Expr(ast.Constant(...)), node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = []
        if isinstance(node, ast.Call) and _call_name(node) in ("skip", "xfail") and "pytest" in ast.unparse(node.func):
            return ast.Constant(None)
        return node


def _without_checks(fn) -> ast.AST:
    return _BlankChecks().visit(normal(fn))


_COMPOUND_FIELDS = ("body", "orelse", "finalbody", "handlers")


def first_difference(before: list, after: list):
    """(before, after, line) of the first statements that differ, as deep as the two agree."""
    a = [dump(s) for s in before]
    b = [dump(s) for s in after]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == 1 and j2 - j1 == 1 and type(before[i1]) is type(after[j1]):
            x, y = before[i1], after[j1]
            for name in _COMPOUND_FIELDS:
                bx, by = getattr(x, name, None), getattr(y, name, None)
                if isinstance(bx, list) and isinstance(by, list) and [dump(s) for s in bx] != [dump(s) for s in by]:
                    headless = [copy.deepcopy(n) for n in (x, y)]
                    for n in headless:
                        setattr(n, name, [])
                    if dump(headless[0]) == dump(headless[1]):
                        return first_difference(bx, by)
                    break
        line = getattr(after[j1] if j1 < len(after) else (after[-1] if after else None), "lineno", 0)
        return _src(before[i1:i2]), _src(after[j1:j2]), line
    return "", "", 0


def _parametrize_cases(dec):
    """(argnames, [case dumps], [case nodes]) of a ``pytest.mark.parametrize`` decorator."""
    if not isinstance(dec, ast.Call) or len(dec.args) < 2:
        return None
    names = ast.unparse(dec.args[0])
    values = dec.args[1]
    if isinstance(values, (ast.List, ast.Tuple)):
        return names, [dump(v) for v in values.elts], values.elts
    return names, [dump(values)], [values]


def compare_function(file: str, name: str, before, after) -> list[Edit]:
    """What changed from the official ``before`` to the repository's ``after`` (same name)."""
    edits = []
    add = lambda kind, b, a, line: edits.append(Edit(file, name, kind, b, a, line))  # noqa: E731
    if dump(before) == dump(after):
        return edits
    if isinstance(before, ast.ClassDef) or not isinstance(after, (ast.FunctionDef, ast.AsyncFunctionDef)):
        b, a, line = first_difference([before], [after]) if type(before) is not type(after) else first_difference(before.body, after.body)
        add(HELPER_CHANGED, b, a, line)
        return edits
    # decorators: skips and xfails added, parametrized cases removed
    bdec = {dump(d): d for d in before.decorator_list}
    for d in after.decorator_list:
        kind = _decorator_kind(d)
        if dump(d) in bdec:
            continue
        if kind in ("skip", "skipif"):
            add(SKIP_ADDED, "(none)", "@" + _src(d), d.lineno)
        elif kind == "xfail":
            add(XFAIL_ADDED, "(none)", "@" + _src(d), d.lineno)
    bpar = {p[0]: (p, d) for d in before.decorator_list if _decorator_kind(d) == "parametrize" and (p := _parametrize_cases(d))}
    apar = {p[0]: (p, d) for d in after.decorator_list if _decorator_kind(d) == "parametrize" and (p := _parametrize_cases(d))}
    for names, ((_, bcases, bnodes), bd) in bpar.items():
        if names not in apar:
            add(PARAMETRIZE_CHANGED, "@" + _src(bd), "(none)", after.lineno)
            continue
        (_, acases, _), ad = apar[names]
        if acases == bcases:
            continue
        gone = [n for c, n in zip(bcases, bnodes) if c not in acases]
        if gone and set(acases) <= set(bcases):
            add(CASES_REMOVED, _src(gone), "(removed)", ad.lineno)
        else:
            add(PARAMETRIZE_CHANGED, "@" + _src(bd), "@" + _src(ad), ad.lineno)
    # skips and xfails called in the body
    for call, kind in (("skip", SKIP_ADDED), ("xfail", XFAIL_ADDED)):
        new = _calls_to(after, {call})
        if len(new) > len(_calls_to(before, {call})):
            add(kind, "(none)", _src(new[-1]), new[-1].lineno)
    if _bare_returns(after) > _bare_returns(before):
        ret = next(n for n in ast.walk(after) if isinstance(n, ast.Return) and n.value is None)
        add(EARLY_RETURN, "(none)", "return", ret.lineno)
    # the checks, aligned in order
    bchecks, achecks = checks_of(before), checks_of(after)
    bd_, ad_ = [dump(c) for c in bchecks], [dump(c) for c in achecks]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, bd_, ad_, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            pairs = list(zip(range(i1, i2), range(j1, j2))) if tag == "replace" else []
            for i, j in pairs:
                add(compare_checks(bchecks[i], achecks[j]), _src(bchecks[i]), _src(achecks[j]), achecks[j].lineno)
            for i in range(i1 + len(pairs), i2):
                add(ASSERTION_REMOVED, _src(bchecks[i]), "(removed)", achecks[j1 - 1].lineno if j1 else after.lineno)
    # imports inside the function (a student's cs336_basics may name its modules otherwise)
    bimp, aimp = _imports(before), _imports(after)
    if bimp != aimp:
        first = next((n for n in ast.walk(after) if isinstance(n, (ast.Import, ast.ImportFrom))), after)
        add(IMPORTS_CHANGED, ", ".join(sorted(bimp - aimp)) or "(none)", ", ".join(sorted(aimp - bimp)) or "(none)", first.lineno)
    # anything else: inputs, set-up, the code under the checks
    if dump(_without_checks(before)) != dump(_without_checks(after)):
        b, a, line = first_difference(_without_checks(before).body, _without_checks(after).body)
        if b or a:
            kind = FIXTURE_CHANGED if _is_fixture(before) else TEST_CHANGED if _is_test_name(name) else HELPER_CHANGED
            add(kind, b, a, line)
    return edits


# --- files ------------------------------------------------------------------------------------

def _signature(fn) -> str:
    args = copy.deepcopy(fn.args)
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    return f"{fn.name}({ast.unparse(args)})"


def _parameters(fn) -> list:
    a = fn.args
    return ([("pos", x.arg) for x in a.posonlyargs + a.args] + [("*", a.vararg.arg if a.vararg else None)]
            + [("kw", x.arg) for x in a.kwonlyargs] + [("**", a.kwarg.arg if a.kwarg else None)])


def compare_adapters(file: str, before: ast.Module, after: ast.Module) -> list[Edit]:
    """The course's adapter names and parameters are kept (the bodies are the student's)."""
    edits = []
    theirs = {n.name: n for n in after.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for fn in before.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        mine = theirs.get(fn.name)
        if mine is None:
            edits.append(Edit(file, fn.name, ADAPTER_MISSING, _signature(fn), "(none)"))
        elif _parameters(mine) != _parameters(fn):
            edits.append(Edit(file, fn.name, ADAPTER_SIGNATURE, _signature(fn), _signature(mine), mine.lineno))
    return edits


def _imports(node) -> set:
    """What ``node``'s import statements bind, as "module.name" strings."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out |= {a.name + (f" as {a.asname}" if a.asname else "") for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = "." * n.level + (n.module or "")
            out |= {f"{base}.{a.name}" + (f" as {a.asname}" if a.asname else "") for a in n.names}
    return out


def _module_statements(tree: ast.Module) -> list:
    return [s for s in _strip_docstring(tree.body)
            if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))]


def compare_module(file: str, before: ast.Module, after: ast.Module) -> list[Edit]:
    """Every test, helper and fixture of one official file against the repository's."""
    edits = []
    if Path(file).name == "adapters.py":
        return compare_adapters(file, before, after)
    # module-level code: imports (as sets), constants, ``pytestmark``
    bimp = _imports(ast.Module([s for s in before.body if isinstance(s, (ast.Import, ast.ImportFrom))], []))
    aimp = _imports(ast.Module([s for s in after.body if isinstance(s, (ast.Import, ast.ImportFrom))], []))
    if bimp != aimp:
        edits.append(Edit(file, "", IMPORTS_CHANGED, ", ".join(sorted(bimp - aimp)) or "(none)", ", ".join(sorted(aimp - bimp)) or "(none)"))
    bstm, astm = _module_statements(before), _module_statements(after)
    bd, ad = [dump(s) for s in bstm], [dump(s) for s in astm]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, bd, ad, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        added = astm[j1:j2]
        marks = [s for s in added if "pytestmark" in ast.unparse(s) and any(k in ast.unparse(s) for k in ("skip", "xfail"))]
        for s in marks:
            edits.append(Edit(file, "", XFAIL_ADDED if "xfail" in ast.unparse(s) else SKIP_ADDED, "(none)", _src(s), s.lineno))
        rest = [s for s in added if s not in marks]
        if bstm[i1:i2] or rest:
            edits.append(Edit(file, "", MODULE_CHANGED, _src(bstm[i1:i2]), _src(rest), (rest or added or [after])[0].lineno if (rest or added) else 0))
    mine, theirs = definitions(before), definitions(after)
    renamed_from = {}
    new_names = [n for n in theirs if n not in mine]
    for name, node in mine.items():
        if name in theirs:
            edits += compare_function(file, name, node, theirs[name])
            continue
        if "." in name and name.split(".")[0] not in theirs and not name.startswith("Test"):
            continue  # a method of a class that is gone: the class is the finding
        if isinstance(node, ast.ClassDef):
            edits.append(Edit(file, name, HELPER_REMOVED, f"class {name}", "(none)"))
            continue
        twin = next((n for n in new_names if n not in renamed_from.values() and not isinstance(theirs[n], ast.ClassDef)
                     and _body_dump(theirs[n]) == _body_dump(node)), None)
        if twin is not None:
            renamed_from[name] = twin
            kind = TEST_RENAMED if _is_test_name(twin) or not _is_test_name(name) else TEST_DISABLED
            edits.append(Edit(file, name, kind, name, twin, theirs[twin].lineno))
        elif _is_fixture(node):
            edits.append(Edit(file, name, FIXTURE_REMOVED, _src(node.decorator_list[0]) + f" def {name}", "(none)"))
        elif _is_test_name(name):
            edits.append(Edit(file, name, TEST_DELETED, f"def {name}", "(none)"))
        else:
            edits.append(Edit(file, name, HELPER_REMOVED, f"def {name}", "(none)"))
    return edits


def _edits_against(path: str, student: bytes, official: bytes) -> list[Edit]:
    if not path.endswith(".py"):
        return [] if student == official else [Edit(path, "", DATA_CHANGED, f"{len(official)} bytes", f"{len(student)} bytes")]
    try:
        after = ast.parse(student.decode("utf-8", "replace"))
    except SyntaxError as exc:
        return [Edit(path, "", UNPARSABLE, "", f"SyntaxError: {exc.msg} (line {exc.lineno})", exc.lineno or 0)]
    try:
        before = ast.parse(official.decode("utf-8", "replace"))
    except SyntaxError:
        return []  # an official version that does not parse here (newer syntax) is no yardstick
    return compare_module(path, before, after)


def file_edits(path: str, student: bytes | None, official: Official, release: str | None) -> tuple[list[Edit], str]:
    """(edits, the official version judged against) of one file; no edits where the file
    equals, or parses to the same tests as, one official version."""
    candidates = official.candidates(path, release)
    if not candidates:
        return [], ""
    if student is None:
        kind = FILE_DELETED if Path(path).name.startswith("test_") or not path.endswith(".py") else COURSE_FILE_DELETED
        return [Edit(path, "", kind, path, "(none)", 0, candidates[0][0])], candidates[0][0]
    same = official.knows_blob(path, blob_id(student), release)
    if same:
        return [], same
    best = None
    for label, text in candidates:
        edits = _edits_against(path, student, text)
        score = (sum(e.weakens for e in edits), len(edits))
        if best is None or score < best[0]:
            best = (score, edits, label)
        if not edits:
            break
    _, edits, label = best
    for e in edits:
        e.official = label
    return edits, label


def repository_edits(repo: Path, official: Official, release: str | None) -> tuple[list[Edit], dict]:
    """Every edit of the course's ``tests/`` in ``repo``, and per file the official version
    it was judged against."""
    edits, versions = [], {}
    theirs = {p.relative_to(repo).as_posix() for p in (repo / "tests").rglob("*") if p.is_file()} if (repo / "tests").is_dir() else set()
    known = {path for v in official.versions for path in v.blobs}
    for path in sorted(set(official.paths(release)) | (theirs & known)):
        mine = repo / path
        student = mine.read_bytes() if mine.is_file() else None
        found, label = file_edits(path, student, official, release)
        edits += found
        if label:
            versions[path] = label
    return edits, versions
