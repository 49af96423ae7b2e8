"""The wheelhouse: a flat directory of wheels, a PEP 503 simple index and ``constraints.txt``.

Layout (``build.wheelhouse`` in the config)::

    wheelhouse/
      torch-2.13.0+rocm7.2-cp312-cp312-linux_x86_64.whl
      simple/index.html                 PEP 503 root: one link per project
      simple/torch/index.html           one link per wheel, with a #sha256= fragment
      constraints.txt                   torch==2.13.0+rocm7.2, one exact pin per project
      stack.json                        what a node needs for these wheels (rocmforge.contract)

The wheelhouse holds one wheel per project: the versions built together. A wheel enters only
through :meth:`Wheelhouse.publish`, after its build succeeded, so a failing build leaves neither
a wheel nor an index entry. Every change happens under one file lock and every index file is
written atomically, so a reader (pip, uv, a web server) never sees half an index.

Installing so that PyPI can never replace our wheels::

    uv pip install --index file://$PWD/wheelhouse/simple vllm      # uv: first index wins
    pip install --find-links wheelhouse -c wheelhouse/constraints.txt vllm   # pip: exact pins
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, canonicalize_name

from rocmforge import contract
from rocmforge.console import console
from rocmforge.fsutil import atomic_write, file_lock, file_sha256, read_json
from rocmforge.wheelfile import wheel_name

_HASHES = ".sha256.json"  # cache: wheel file name -> [size, mtime_ns, sha256]


@dataclass(frozen=True)
class Entry:
    """One wheel in the wheelhouse."""

    project: str
    version: str
    path: Path
    sha256: str


class Wheelhouse:
    """The local index at ``root`` (created on first publish)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.simple = self.root / "simple"
        self.constraints = self.root / "constraints.txt"

    @contextlib.contextmanager
    def locked(self, what: str = "") -> Iterator[None]:
        """Hold the wheelhouse lock; says who holds it when we have to wait."""
        with file_lock(
            self.root / ".lock",
            what=what,
            on_wait=lambda holder: console.print(f"waiting for the wheelhouse lock ({holder})"),
        ):
            yield

    def entries(self) -> list[Entry]:
        """Every wheel present, sorted by project."""
        if not self.root.is_dir():
            return []
        cache = read_json(self.root / _HASHES) or {}
        result = []
        for path in sorted(self.root.glob("*.whl")):
            problem = _unusable(path)
            if problem:  # indexed, pip would fail on it at install time; a bad name was a traceback
                console.print(f"{path}: {problem}; left out of the index - delete it or rebuild it")
                continue
            name = wheel_name(path)
            result.append(Entry(name.project, name.version, path, self._sha256(path, cache)))
        return sorted(result, key=lambda e: (e.project, e.path.name))

    def find(self, project: str) -> list[Entry]:
        """The wheels of ``project`` (any spelling of the name)."""
        wanted = canonicalize_name(project)
        return [e for e in self.entries() if e.project == wanted]

    def publish(self, wheel: str | os.PathLike[str]) -> Entry:
        """Move a finished wheel in, replacing older wheels of the same project; reindex."""
        wheel = Path(wheel)
        name = wheel_name(wheel)
        with self.locked(f"publishing {name.filename}"):
            self.root.mkdir(parents=True, exist_ok=True)
            target = self.root / name.filename
            tmp = self.root / f".{name.filename}.tmp"
            shutil.copyfile(wheel, tmp)
            os.replace(tmp, target)
            for old in self.entries():
                if old.path != target and old.project == name.project:
                    old.path.unlink()
            self._reindex()
        return next(e for e in self.find(name.project) if e.path == target)

    def withdraw(self, project: str) -> list[Path]:
        """Remove ``project``'s wheels and index entry; return the removed files."""
        with self.locked(f"withdrawing {project}"):
            gone = [e.path for e in self.find(project)]
            for path in gone:
                path.unlink()
            if gone:
                self._reindex()
        return gone

    def reindex(self) -> list[Entry]:
        """Regenerate ``simple/`` and ``constraints.txt`` from the wheels present.

        A wheelhouse that does not exist stays absent (no lock file, no empty index).
        """
        if not self.root.is_dir():
            return []
        with self.locked("reindexing"):
            return self._reindex()

    def _reindex(self) -> list[Entry]:
        entries = self.entries()
        if not entries:
            # No index rather than an empty one: a header-only constraints.txt pins nothing, so
            # `pip install -c constraints.txt vllm` would quietly take vllm from PyPI.
            for path in (self.simple, self.constraints, self.root / _HASHES, self.root / contract.STACK_FILE):
                _remove(path)
            return entries
        by_project: dict[str, list[Entry]] = {}
        for e in entries:
            by_project.setdefault(e.project, []).append(e)
        for project, items in by_project.items():
            links = "\n".join(
                _link(f"../../{quote(e.path.name)}#sha256={e.sha256}", e.path.name) for e in items
            )
            atomic_write(self.simple / project / "index.html", _page(f"Links for {project}", links))
        root_links = "\n".join(_link(f"{p}/", p) for p in by_project)
        stack = contract.stack_document(entries)
        atomic_write(self.root / contract.STACK_FILE, json.dumps(stack, indent=2, sort_keys=True) + "\n")
        atomic_write(
            self.simple / "index.html", _page("Simple index", f"{root_links}\n{contract.html_table(stack)}")
        )
        for stale in self.simple.iterdir():
            if stale.is_dir() and stale.name not in by_project:
                shutil.rmtree(stale)
        pins = "".join(f"{e.project}=={e.version}\n" for e in entries)
        atomic_write(
            self.constraints,
            "# Exact versions built together by rocmforge; use with pip -c.\n" + pins,
        )
        self._save_hashes({e.path.name: e for e in entries})
        return entries

    def _sha256(self, path: Path, cache: dict[str, list]) -> str:
        st = path.stat()
        hit = cache.get(path.name)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        digest = file_sha256(path)
        cache[path.name] = [st.st_size, st.st_mtime_ns, digest]
        return digest

    def _save_hashes(self, entries: dict[str, Entry]) -> None:
        data = {}
        for fname, e in entries.items():
            st = e.path.stat()
            data[fname] = [st.st_size, st.st_mtime_ns, e.sha256]
        atomic_write(self.root / _HASHES, json.dumps(data, indent=1, sort_keys=True))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _unusable(path: Path) -> str | None:
    """Why ``path`` (named ``*.whl``) cannot be served as a wheel, or None when it can."""
    if not path.is_file():
        return "not a file"
    try:
        wheel_name(path)
    except InvalidWheelFilename:
        return "not a wheel file name (name-version-python-abi-platform.whl)"
    if not zipfile.is_zipfile(path):
        return "not a zip archive (a truncated download or copy?)"
    return None


def install_commands(root: str | os.PathLike[str], projects: list[str]) -> list[str]:
    """The install commands under which no newer PyPI release can replace our wheels."""
    root = Path(root).resolve()
    names = " ".join(projects)
    return [
        f"uv pip install --index {root.as_uri()}/simple {names}",
        f"pip install --find-links {root} -c {root / 'constraints.txt'} {names}",
    ]


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a><br>'


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html>\n<head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{title}</title></head>\n<body>\n<h1>{title}</h1>\n{body}\n</body>\n</html>\n"
    )
