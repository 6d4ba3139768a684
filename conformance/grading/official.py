"""The course's own test files: every version an official checkout holds.

``--official`` is a checkout of the course's assignment repository.  Its working tree is one
version of ``tests/``; where it is a git checkout, every commit of its history that touched
``tests/`` is another, labelled with the release version its ``pyproject.toml`` names then
(``26.1.2``, ``1.0.5``) and the release its adapters follow.  A student who started from an
older release, or took a later patch, has not edited a test that equals one of them: the
course itself relaxed FSDP's ``torch.equal`` checks to ``allclose`` in 26.1.2.
"""

from __future__ import annotations

import hashlib
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from conformance.grading.releases import release_of_adapters

TESTS = "tests"


def blob_id(data: bytes) -> str:
    """git's object id of a file's bytes: equal contents, equal ids, without reading both."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(root: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], input=data, capture_output=True, check=True).stdout


def is_git_checkout(root: Path) -> bool:
    """Is ``root`` the top of a git work tree (not a folder inside another one's)?"""
    try:
        top = _git(root, "rev-parse", "--show-toplevel").decode().strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False
    return bool(top) and Path(top).resolve() == Path(root).resolve()


def head_commit(root: Path) -> str:
    """The checkout's HEAD commit, or "" where it is not a git checkout."""
    if not is_git_checkout(root):
        return ""
    try:
        return _git(root, "rev-parse", "HEAD").decode().strip()
    except subprocess.CalledProcessError:
        return ""


def _version_of(pyproject: Path) -> str:
    try:
        return str(tomllib.loads(pyproject.read_text(errors="replace")).get("project", {}).get("version", ""))
    except (OSError, tomllib.TOMLDecodeError):
        return ""


@dataclass
class Version:
    """One version of the course's ``tests/``: path -> blob id, and where it came from."""

    label: str
    release: str | None
    commit: str = ""
    blobs: dict = field(default_factory=dict)


@dataclass
class Official:
    root: Path
    versions: list  # newest first; the working tree leads
    _contents: dict = field(default_factory=dict)  # blob id -> bytes

    @property
    def release(self) -> str | None:
        return self.versions[0].release if self.versions else None

    @property
    def label(self) -> str:
        return self.versions[0].label if self.versions else ""

    @property
    def commit(self) -> str:
        return head_commit(self.root)

    def content(self, blob: str) -> bytes:
        if blob not in self._contents:
            self._contents[blob] = _git(self.root, "cat-file", "blob", blob)
        return self._contents[blob]

    def paths(self, release: str | None = None) -> list[str]:
        """Test file paths of the newest version of ``release`` (or of the checkout)."""
        newest = next((v for v in self.versions if release is None or v.release == release), self.versions[0])
        return sorted(newest.blobs)

    def candidates(self, path: str, release: str | None) -> list[tuple[str, bytes]]:
        """(label, contents) of each distinct official version of ``path``, newest first: the
        versions of the repository's own release where the file exists in it, else all."""
        for pool in ([v for v in self.versions if v.release == release] if release else [], self.versions):
            seen, out = set(), []
            for v in pool:
                blob = v.blobs.get(path)
                if blob and blob not in seen:
                    seen.add(blob)
                    out.append((v.label, self.content(blob)))
            if out:
                return out
        return []

    def knows_blob(self, path: str, blob: str, release: str | None = None) -> str | None:
        """The label of an official version whose ``path`` has exactly these bytes (one of
        ``release`` first)."""
        ordered = sorted(self.versions, key=lambda v: v.release != release)
        return next((v.label for v in ordered if v.blobs.get(path) == blob), None)


def load_official(root: Path) -> Official:
    """Every version of ``root``'s ``tests/`` (the working tree, then its git history)."""
    root = Path(root).resolve()
    if not (root / TESTS / "adapters.py").is_file():
        raise FileNotFoundError(f"--official {root}: no {TESTS}/adapters.py there (a checkout of the course's repository?)")
    official = Official(root, [])
    work = Version(f"the checkout {_version_of(root / 'pyproject.toml')}".strip(),
                   release_of_adapters((root / TESTS / "adapters.py").read_text(errors="replace")))
    for path in sorted((root / TESTS).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            data = path.read_bytes()
            blob = blob_id(data)
            official._contents[blob] = data
            work.blobs[path.relative_to(root).as_posix()] = blob
    official.versions.append(work)
    if not is_git_checkout(root):
        return official
    for commit in _git(root, "rev-list", "HEAD", "--", TESTS).decode().split():
        listing = _git(root, "ls-tree", "-r", "-z", commit, "--", TESTS).split(b"\0")
        blobs = {}
        for rec in filter(None, listing):
            meta, path = rec.split(b"\t", 1)
            _, kind, blob = meta.split()
            if kind == b"blob":
                blobs[path.decode()] = blob.decode()
        adapters = blobs.get(f"{TESTS}/adapters.py")
        release = release_of_adapters(official.content(adapters).decode("utf-8", "replace")) if adapters else None
        subject = _git(root, "log", "-1", "--format=%s", commit).decode().strip()
        official.versions.append(Version(f"{commit[:7]} ({subject[:60]})", release, commit, blobs))
    if len(official.versions) > 1 and official.versions[1].blobs == work.blobs:
        official.versions.pop(0)  # the working tree is HEAD's tests/: one version, named by its commit
    return official
