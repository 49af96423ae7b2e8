"""The wheelhouse: a flat directory of wheels, a PEP 503 simple index and ``constraints.txt``.

Layout (``build.wheelhouse`` in the config)::

    wheelhouse/
      torch-2.13.0+rocm7.2-cp312-cp312-linux_x86_64.whl
      torch-2.13.0+rocm7.2-cp312-cp312-linux_x86_64.whl.intoto.json   its provenance statement
      simple/index.html                 PEP 503 root: one link per project
      simple/torch/index.html           one link per wheel, with a #sha256= fragment, and one
                                        to its provenance statement (also the anchor's
                                        data-provenance attribute, as in PEP 740)
      constraints.txt                   torch==2.13.0+rocm7.2, one exact pin per project
      requirements.txt                  stack + runtime dependencies, hash-pinned (rocmforge.build.install)
      stack.json                        what a node needs for these wheels (rocmforge.build.contract)

The wheelhouse holds one wheel per project: the versions built together. A wheel enters only
through :meth:`Wheelhouse.publish`, after its build succeeded, so a failing build leaves neither
a wheel nor an index entry.

Every published state is one *generation*, a complete directory ``.index-XXXX/`` holding the
wheels (hard links, so unchanged wheels cost no copy), ``simple/``, ``constraints.txt``, every
file of :data:`INDEX_WRITERS` and ``.record.json`` (each wheel's sha256 at publish). The names
users see at the root are fixed symlinks into ``.index``, itself a symlink to the current
generation: a publish stages the next generation, then switches ``.index`` with one rename.
A reader (pip, uv, a web server) therefore sees the old set or the new one, never a new wheel
with an old index; a kill at any moment leaves one of them, and the next run sweeps the rest.
Every change happens under one file lock.

Installing so that nothing else can replace our wheels: :mod:`rocmforge.build.install`.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, canonicalize_name

from rocmforge.build import contract, install, killpoints
from rocmforge.build.provenance import statement_path
from rocmforge.build.wheelfile import read_member, wheel_name
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, file_sha256, read_json

_CURRENT = ".index"  # symlink -> the published generation directory
_GENERATION = ".index-"  # prefix of generation directories
_RECORD = ".record.json"  # in a generation: wheel file name -> what was published
_LEGACY = (".sha256.json",)  # files of the layout before generations


@dataclass(frozen=True)
class Entry:
    """One wheel in the wheelhouse, with the sha256 recorded when it was published."""

    project: str
    version: str
    path: Path
    sha256: str
    # The wheels it was built against (its provenance's ``dependencies``): name -> sha256.
    dependencies: Mapping[str, str] = field(default_factory=dict)


# Files published with the index, in the same switch. Each writer gets the entries of the new
# generation (their ``path`` is the staged wheel, readable) and returns {file name: content};
# every name appears at the wheelhouse root. Add a writer here to publish another file.
IndexWriter = Callable[[list[Entry]], Mapping[str, str | bytes]]


def _constraints(entries: list[Entry]) -> dict[str, str]:
    pins = "".join(f"{e.project}=={e.version}\n" for e in entries)
    return {"constraints.txt": "# Exact versions built together by rocmforge; use with pip -c.\n" + pins}


def _stack(entries: list[Entry]) -> dict[str, str]:
    document = contract.stack_document(entries)
    return {contract.STACK_FILE: json.dumps(document, indent=2, sort_keys=True) + "\n"}


def _requirements(entries: list[Entry]) -> dict[str, str]:
    # The writers run once the staged generation's project pages exist: resolve against those.
    simple = entries[0].path.parent / "simple"
    resolved = install.requirements_file(entries, simple)
    if resolved.missing:  # offline, or a dependency no index has: published all the same, said
        console.print(
            f"warning: {install.REQUIREMENTS} lacks {', '.join(resolved.missing)}: not resolvable here "
            f"({resolved.reason}); it pins the stack's wheels and what was found offline, install the "
            "rest from your own mirror or run `nox -s index` again with the network",
            markup=False,
            soft_wrap=True,
        )
    return {install.REQUIREMENTS: resolved.text}


INDEX_WRITERS: list[IndexWriter] = [_constraints, _stack, _requirements]


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
        """Every wheel published, sorted by project, with its recorded sha256.

        Wheels copied into the root by hand (or left by the layout before generations) are
        listed too, hashed now; the next publish or reindex records them.
        """
        if not self.root.is_dir():
            return []
        record = self._record()
        result = [
            Entry(v["project"], v["version"], self.root / name, v["sha256"], v.get("dependencies", {}))
            for name, v in record.items()
        ]
        for path in self._dropped_in(record):
            result.append(_entry(path, self.root / path.name, _sha256(path)))
        return sorted(result, key=lambda e: (e.project, e.path.name))

    def find(self, project: str) -> list[Entry]:
        """The wheels of ``project`` (any spelling of the name)."""
        wanted = canonicalize_name(project)
        return [e for e in self.entries() if e.project == wanted]

    def entry(self, filename: str) -> Entry | None:
        """The published entry of the wheel file ``filename``, or None."""
        return next((e for e in self.entries() if e.path.name == filename), None)

    def verify(self, entry: Entry) -> bool:
        """Whether ``entry``'s file still has the sha256 recorded at publish; says so when not.

        Size and mtime prove nothing (a same-size wheel with its mtime restored passes them),
        so this hashes the bytes (once per process while the inode is untouched).
        """
        problem = _mismatch(entry.path, entry.sha256)
        if problem:
            shown = self.root / entry.path.name
            console.print(f"{shown}: {problem}; not using it", markup=False, soft_wrap=True)
        return problem is None

    def publish(self, wheel: str | os.PathLike[str]) -> Entry:
        """Add a finished wheel, replacing older wheels of the same project, in one switch.

        Refused (``UserError``) when the wheel was built against dependency wheels the
        wheelhouse no longer holds; wheels built against the replaced one are withdrawn. The
        wheel's provenance statement (``<wheel>.intoto.json`` beside it) comes along; a
        statement of an earlier wheel of the same name does not, since it describes other bytes.
        """
        wheel = Path(wheel)
        name = wheel_name(wheel)
        with self.locked(f"publishing {name.filename}"):
            self.root.mkdir(parents=True, exist_ok=True)
            self._sweep()
            # A copy, not a link: the caller's file stays the caller's to change.
            fd, tmp = tempfile.mkstemp(prefix=f".{name.filename}.", suffix=".tmp", dir=self.root)
            os.close(fd)
            try:
                shutil.copyfile(wheel, tmp)
                killpoints.reached("publish:copied", name.project)
                new = _entry(wheel, Path(tmp), file_sha256(tmp))
                checked = self._checked()
                keep = [e for e in checked if e.project != name.project]
                statement = statement_path(wheel)
                self._switch(
                    [*keep, new],
                    retired=[e for e in checked if e.project == name.project],
                    new=new,
                    names={Path(tmp).name: name.filename},
                    statements={name.filename: statement} if statement.is_file() else {},
                )
            finally:
                Path(tmp).unlink(missing_ok=True)
            return Entry(new.project, new.version, self.root / name.filename, new.sha256, new.dependencies)

    def withdraw(self, project: str) -> list[Path]:
        """Remove ``project``'s wheels and index entry; return the removed files."""
        with self.locked(f"withdrawing {project}"):
            self._sweep()
            entries = self._checked()
            wanted = canonicalize_name(project)
            gone = [self.root / e.path.name for e in entries if e.project == wanted]
            if gone:
                self._switch(
                    [e for e in entries if e.project != wanted],
                    retired=[e for e in entries if e.project == wanted],
                )
        return gone

    def tidy(self) -> None:
        """Sweep what a killed run left (temp files, a half-staged generation), if anything."""
        if self.root.is_dir():
            with self.locked("tidying"):
                self._sweep()

    def reindex(self) -> list[Entry]:
        """Regenerate ``simple/`` and ``constraints.txt`` from the wheels present.

        A wheelhouse that does not exist stays absent (no lock file, no empty index).
        """
        if not self.root.is_dir():
            return []
        with self.locked("reindexing"):
            self._sweep()
            self._switch(self._checked())
            return self.entries()

    # -- the generation machinery; callers hold the lock ---------------------------------

    def _record(self) -> dict[str, dict]:
        data = read_json(self.root / _CURRENT / _RECORD)
        return data if isinstance(data, dict) else {}

    def _dropped_in(self, record: Mapping[str, dict]) -> list[Path]:
        """Usable wheel files at the root that no generation holds (a hand copy, the old layout)."""
        found = []
        for path in sorted(self.root.glob("*.whl")):
            if _is_staged(path) or (path.is_symlink() and not path.exists()):
                continue  # ours, from a publish in progress or cut short; swept under the lock
            if path.name in record:
                continue  # a recorded name that is not ours any more: the sweep puts ours back
            problem = _unusable(path)
            if problem:  # indexed, pip would fail on it at install time; a bad name was a traceback
                console.print(f"{path}: {problem}; left out of the index - delete it or rebuild it")
                continue
            found.append(path)
        return found

    def _checked(self) -> list[Entry]:
        """The current set, each wheel's bytes checked against its record; mismatches dropped.

        ``path`` of each entry is where its bytes are now (generation or hand copy).
        """
        record = self._record()
        current = self.root / _CURRENT
        result = []
        for fname, v in record.items():
            e = Entry(v["project"], v["version"], current / fname, v["sha256"], v.get("dependencies", {}))
            if self.verify(e):
                result.append(e)
        for path in self._dropped_in(record):
            result.append(_entry(path, path, _sha256(path)))
        return result

    def _switch(
        self,
        entries: list[Entry],
        *,
        retired: list[Entry] = (),
        new: Entry | None = None,
        names: Mapping[str, str] = {},
        statements: Mapping[str, Path] = {},
    ) -> None:
        """Stage a generation holding exactly ``entries``, then make it the visible one.

        ``retired``: entries leaving the set; a hand copy among them (a file, not one of our
        names) is deleted after the switch, or the next reindex would take it back in.
        ``names`` renames files on the way in (a temp copy -> the wheel's own name);
        ``statements`` gives a wheel (by its name) a provenance statement from elsewhere; the
        others keep the statement they have beside them.
        """
        kept = self._consistent(entries, new)
        retired = [*retired, *(e for e in entries if e not in kept)]
        entries = kept
        project = new.project if new is not None else ""  # for the kill test's points
        if not entries:
            # No index rather than an empty one: a header-only constraints.txt pins nothing, so
            # `pip install -c constraints.txt vllm` would quietly take vllm from PyPI.
            (self.root / _CURRENT).unlink(missing_ok=True)
            for legacy in (self.simple, self.constraints, self.root / contract.STACK_FILE):  # old layout
                _remove(legacy)
            self._sweep()
            self._delete_hand_copies(retired)
            return
        stage = Path(tempfile.mkdtemp(prefix=_GENERATION, dir=self.root))
        try:
            stage.chmod(0o755)  # mkdtemp's 0700 would hide the index from a web server's user
            staged = []
            for e in sorted(entries, key=lambda e: (e.project, e.path.name)):
                target = stage / names.get(e.path.name, e.path.name)
                _link_or_copy(e.path, target)
                statement = statements.get(target.name) or statement_path(e.path)
                if statement.is_file():
                    _link_or_copy(statement, statement_path(target))
                staged.append(Entry(e.project, e.version, target, e.sha256, e.dependencies))
            self._write_index(stage, staged)
            _fsync_dir(stage)
            killpoints.reached("publish:staged", project)
            visible = sorted(p.name for p in stage.iterdir() if not p.name.startswith("."))
            for name in visible:
                # A new name must exist before the index that links it: it points into the
                # staged generation until the sweep after the switch points it at .index.
                if not os.path.lexists(self.root / name):
                    _symlink(self.root / name, f"{stage.name}/{name}")
            current = self.root / _CURRENT
            if current.is_symlink():
                # Names leaving with this switch keep leading to the old generation's file until
                # the sweep after it removes both: the old wheel goes last.
                for path in self.root.iterdir():
                    if _is_ours(path) and path.name not in visible:
                        _symlink(path, f"{os.readlink(current)}/{path.name}")
            killpoints.reached("publish:linked", project)
            _symlink(self.root / _CURRENT, stage.name)  # the switch
            killpoints.reached("publish:switched", project)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        _fsync_dir(self.root)
        self._sweep()
        self._delete_hand_copies(retired)

    def _delete_hand_copies(self, retired: list[Entry]) -> None:
        for e in retired:
            if e.path.parent == self.root and e.path.is_file() and not e.path.is_symlink():
                e.path.unlink()

    def _consistent(self, entries: list[Entry], new: Entry | None) -> list[Entry]:
        """``entries`` minus wheels built against dependency wheels not among them.

        The wheel being published is refused instead: it lost a race with its dependency.
        """
        while True:
            shas = {e.sha256 for e in entries}
            stale = [e for e in entries if any(sha not in shas for sha in e.dependencies.values())]
            if not stale:
                return entries
            for e in stale:
                deps = ", ".join(f"{d} {s[:12]}" for d, s in e.dependencies.items() if s not in shas)
                if e is new:
                    raise UserError(
                        f"{e.project}: built against {deps}, which the wheelhouse no longer holds "
                        f"(replaced meanwhile); rebuild it (nox -s {e.project})"
                    )
                console.print(
                    f"{e.project}: built against {deps}, which the wheelhouse no longer holds; "
                    f"withdrawn from the index, rebuild it (nox -s {e.project})",
                    markup=False,
                )
            entries = [e for e in entries if e not in stale]

    def _write_index(self, stage: Path, entries: list[Entry]) -> None:
        by_project: dict[str, list[Entry]] = {}
        for e in entries:
            by_project.setdefault(e.project, []).append(e)
        for project, items in by_project.items():
            links = "\n".join(_wheel_links(e) for e in items)
            atomic_write(stage / "simple" / project / "index.html", _page(f"Links for {project}", links))
        root_links = "\n".join(_link(f"{p}/", p) for p in by_project)
        for writer in INDEX_WRITERS:
            for name, data in writer(entries).items():
                atomic_write(stage / name, data)
        stack = json.loads((stage / contract.STACK_FILE).read_text())
        atomic_write(
            stage / "simple" / "index.html",
            _page("Simple index", f"{root_links}\n{contract.html_table(stack)}"),
        )
        record = {
            e.path.name: {
                "project": e.project,
                "version": e.version,
                "sha256": e.sha256,
                "size": e.path.stat().st_size,
                "dependencies": dict(e.dependencies),
            }
            for e in entries
        }
        atomic_write(stage / _RECORD, json.dumps(record, indent=1, sort_keys=True))

    def _sweep(self) -> None:
        """Finish or undo what a killed run left: root names, old generations, temp files."""
        if not self.root.is_dir():
            return
        current = self.root / _CURRENT
        target = os.readlink(current) if current.is_symlink() else None
        visible = {p.name for p in current.iterdir() if not p.name.startswith(".")} if target else set()
        record = self._record()
        for name in visible:  # a staged link, a real file or directory (hand copy, old layout) -> ours
            path = self.root / name
            if not _is_ours(path):
                if (
                    not _is_staged(path)
                    and name in record
                    and path.is_file()
                    and file_sha256(path) != record[name]["sha256"]
                ):
                    console.print(
                        f"{path}: not the wheel published under this name; put the published one back",
                        markup=False,
                    )
                if path.is_dir() and not path.is_symlink():
                    old = Path(tempfile.mkdtemp(prefix=_GENERATION, dir=self.root))
                    os.replace(path, old / name)
                _symlink(path, f"{_CURRENT}/{name}")
        for path in self.root.iterdir():
            name = path.name
            if (_is_ours(path) or _is_staged(path)) and name not in visible:
                path.unlink()  # the old wheel goes last, after the switch
            elif name.startswith(_GENERATION) and name != target:
                shutil.rmtree(path, ignore_errors=True)
            elif (name.startswith(".") and name.endswith(".tmp")) or name in _LEGACY:
                path.unlink(missing_ok=True)


def _wheel_links(e: Entry) -> str:
    """The index lines of one wheel: the wheel, then its provenance statement when there is one.

    The statement's URL is also the wheel anchor's ``data-provenance`` attribute (PEP 740's
    place for it); pip and uv skip the statement's own link, which is not a distribution file.
    """
    href = f"../../{quote(e.path.name)}#sha256={e.sha256}"
    statement = statement_path(e.path)
    if not statement.is_file():
        return _link(href, e.path.name)
    stmt_href = f"../../{quote(statement.name)}"
    return (
        f'<a href="{html.escape(href)}" data-provenance="{html.escape(stmt_href)}">'
        f"{html.escape(e.path.name)}</a><br>\n" + _link(stmt_href, statement.name)
    )


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is one of the root symlinks into the current generation."""
    return path.is_symlink() and os.readlink(path).startswith(f"{_CURRENT}/")


def _is_staged(path: Path) -> bool:
    """Whether ``path`` is a root symlink into a generation directory (made before a switch)."""
    return path.name != _CURRENT and path.is_symlink() and os.readlink(path).startswith(_GENERATION)


def _symlink(path: Path, target: str) -> None:
    """Point ``path`` at ``target`` in one rename (replacing a file or symlink there)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, path)


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link (no copy of gigabytes) when possible; a copy across filesystems."""
    try:
        os.link(src, dest, follow_symlinks=True)
    except OSError:
        shutil.copyfile(src, dest)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _entry(path: Path, shown: Path, sha256: str) -> Entry:
    """An entry for the wheel file at ``path`` (listed as ``shown``), dependencies from provenance."""
    name = wheel_name(path)
    return Entry(name.project, name.version, shown, sha256, _dependencies(path))


def _dependencies(path: Path) -> dict[str, str]:
    """The dependency wheels' sha256 that rocmforge recorded inside the wheel, if any."""
    from rocmforge.build import provenance

    try:
        data = json.loads(read_member(path, provenance.FILENAME) or b"{}")
    except (OSError, ValueError, zipfile.BadZipFile):
        return {}
    deps = data.get("dependencies") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in deps.items()} if isinstance(deps, dict) else {}


_hashed: dict[tuple, str] = {}  # (path, inode, size, mtime, ctime) -> sha256, for this process


def _sha256(path: Path, st: os.stat_result | None = None) -> str:
    """``path``'s sha256, hashed once per process while the file is untouched."""
    st = st or path.stat()
    # ctime cannot be set back by hand, so a file changed since it was hashed gets a new key.
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _hashed:
        _hashed[key] = file_sha256(path)
    return _hashed[key]


def _mismatch(path: Path, sha256: str) -> str | None:
    """Why ``path`` is not the wheel whose sha256 was recorded at publish, or None when it is."""
    try:
        st = path.stat()
    except OSError:
        return "missing"
    have = _sha256(path, st)
    if have != sha256:
        return f"sha256 {have[:12]} differs from the {sha256[:12]} recorded when it was published"
    return None


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


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a><br>'


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html>\n<head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{title}</title></head>\n<body>\n<h1>{title}</h1>\n{body}\n</body>\n</html>\n"
    )
