"""A repository's packages, importable as its ``pyproject.toml`` declares them, installed nowhere.

What the grader reads:

    [project] name, version               the repository's own distribution
    [tool.uv.build-backend] module-root   where its package lives ("" = the root; uv's
                                          default "src"), also setuptools' ``package-dir``
    [tool.uv.sources] NAME = { path = "./cs336-basics" }
                                          a path dependency: its folder holds a project of
                                          its own (its pyproject names its package root)

Each package root goes on the child's ``PYTHONPATH``.  A repository's code may read its own
installed metadata (``importlib.metadata.version("cs336-systems")`` in the course's
``cs336_systems/__init__.py`` up to release 26.1.1), which an uninstalled checkout lacks: the
grader writes a ``NAME-VERSION.dist-info/METADATA`` for the repository and each path
dependency into a folder of the repository's own on the path, so those look-ups succeed
without installing anything into the grader's environment.

A path that is not in the repository (``../assignment1-basics``, the student's own machine)
is replaced by a folder of the repository named like the dependency, where there is one,
and the record says so.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


def normalize(name: str) -> str:
    """A distribution name as packaging compares them (PEP 503), with underscores."""
    return re.sub(r"[-_.]+", "_", name).lower()


@dataclass
class Project:
    """One distribution: its name, version, folder and the folder its package imports from."""

    name: str
    version: str
    folder: Path
    import_root: Path
    package: str = ""


@dataclass
class Layout:
    """What a repository needs on its path: its projects (itself first) and what was noticed."""

    projects: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def python_path(self) -> list[str]:
        out = []
        for p in self.projects:
            if str(p.import_root) not in out:
                out.append(str(p.import_root))
        return out


def _read(pyproject: Path) -> dict:
    try:
        return tomllib.loads(pyproject.read_text(errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _package_root(folder: Path, config: dict, package: str) -> Path:
    """The folder from which ``package`` imports: the declared module root, ``src``, the
    project folder, or (a project folder that is itself the package) its parent."""
    tool = config.get("tool", {})
    declared = []
    root = tool.get("uv", {}).get("build-backend", {}).get("module-root")
    if isinstance(root, str):
        declared.append(folder / root)
    package_dir = tool.get("setuptools", {}).get("package-dir", {})
    if isinstance(package_dir, dict) and isinstance(package_dir.get(""), str):
        declared.append(folder / package_dir[""])
    for candidate in declared + [folder / "src", folder]:
        if (candidate / package / "__init__.py").is_file() or (candidate / f"{package}.py").is_file():
            return candidate.resolve()
    if folder.name == package and (folder / "__init__.py").is_file():
        return folder.parent.resolve()
    return (declared[0] if declared else folder).resolve()


def read_project(folder: Path, fallback_name: str = "") -> Project:
    config = _read(folder / "pyproject.toml")
    meta = config.get("project", {})
    name = str(meta.get("name") or fallback_name or folder.name)
    module = config.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-name")
    package = module if isinstance(module, str) and module else normalize(name)
    return Project(name=name, version=str(meta.get("version") or "0"), folder=folder.resolve(),
                   import_root=_package_root(folder, config, package), package=package)


def _stand_in(repo: Path, dependency: str) -> Path | None:
    """A folder of the repository named like ``dependency`` (``cs336-basics``, ``cs336_basics``)."""
    wanted = normalize(dependency)
    for child in sorted(repo.iterdir()) if repo.is_dir() else ():
        if child.is_dir() and normalize(child.name) == wanted:
            return child
    return None


def read_layout(repo: Path) -> Layout:
    """The repository's own project and its path dependencies, each with its import root."""
    repo = repo.resolve()
    layout = Layout()
    config = _read(repo / "pyproject.toml")
    if not config:
        layout.notes.append("no readable pyproject.toml: the repository's root alone is on the path")
    layout.projects.append(read_project(repo))
    sources = config.get("tool", {}).get("uv", {}).get("sources", {})
    for dependency, source in sources.items() if isinstance(sources, dict) else ():
        if not isinstance(source, dict) or "path" not in source:
            continue  # git, index or workspace sources: the environment's to provide
        folder = (repo / source["path"]).resolve()
        inside = folder == repo or repo in folder.parents
        if not (folder.exists() and inside):
            stand_in = _stand_in(repo, dependency)
            where = "outside the repository" if not inside else "absent"
            if stand_in is None:
                layout.notes.append(f"path source {dependency} = {source['path']!r} is {where}; {dependency} will not import")
                continue
            layout.notes.append(f"path source {dependency} = {source['path']!r} is {where}; used ./{stand_in.name} instead")
            folder = stand_in
        if folder.is_file():
            continue  # a wheel or sdist: not unpacked here
        layout.projects.append(read_project(folder, dependency))
    return layout


def write_metadata(layout: Layout, site: Path) -> list[str]:
    """A ``NAME-VERSION.dist-info`` per project under ``site`` (so ``importlib.metadata``
    finds the repository's own distributions); the names written."""
    site.mkdir(parents=True, exist_ok=True)
    written = []
    for p in layout.projects:
        info = site / f"{normalize(p.name)}-{p.version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {p.name}\nVersion: {p.version}\n")
        (info / "top_level.txt").write_text(p.package + "\n")
        written.append(f"{p.name} {p.version}")
    return written
