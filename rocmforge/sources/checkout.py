"""Pinned sources: fetch, verify and check out each package's source into ``third_party/<pkg>``.

One per-user cache (``build.cache_dir``) is shared by every checkout::

    <cache>/git/<slug>.git         a bare mirror per URL; commits fetched shallowly by sha
    <cache>/git/<slug>.pins.json   which (rev, commit) pairs were verified against the server
    <cache>/archives/<sha256>/<f>  downloaded sdists and archives, stored under their hash

(:mod:`rocmforge.sources.mirrors` and :mod:`rocmforge.sources.archives` fill it; this module
turns a pin into a checked-out, patched tree and keeps the stamp.)

A checkout is a git work tree whose objects live in the mirror (``objects/info/alternates``),
so re-checking out costs no copies. Next to it, ``third_party/.<pkg>.stamp.json`` is written
last and says what the tree holds; a run whose pin and patch set match the stamp does nothing
else. A run that changes the tree deletes the stamp first, so a run killed halfway leaves no
stamp and the next run resets the tree (new trees are built under a temporary name and renamed).

Each mirror, archive and checkout has a file lock; a second run waits and says who holds it.
Network errors are retried with backoff; ``offline=True`` (or ``ROCMFORGE_OFFLINE_BUNDLE``, an
export made by ``nox -s export``) never touches the network and names what is missing.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from packaging.version import InvalidVersion, Version

from rocmforge.config import Config, Package, Source
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, json_sha256, read_json
from rocmforge.sources import git, lock
from rocmforge.sources import patches as patchmod
from rocmforge.sources.archives import (
    archive_location,
    cached_archive,
    import_archive,
    import_directory,
    reusable_import,
    rocm_tree,
    tree_sha256,
)
from rocmforge.sources.cache import replace_tree, waiting
from rocmforge.sources.mirrors import (
    HEX_RE,
    bundle_dir,
    git_dirs,
    materialize,
    reset_tree,
    resolve_repo,
    walk,
)

STAMP_VERSION = 2
# Triton's pin as PyTorch records it (read from the PyTorch tree when ``pin_from = "pytorch"``).
PYTORCH_TRITON_COMMIT = ".ci/docker/ci_commit_pins/triton.txt"
PYTORCH_TRITON_VERSION = ".ci/docker/triton_version.txt"


@dataclass(frozen=True)
class Checkout:
    """A prepared source tree: exactly what was pinned, with our patches applied."""

    package: str
    path: Path  # tree root, third_party/<pkg> (or the local tree of a ``path`` source)
    project_dir: Path  # path / source.subdir: where the build runs
    kind: str  # git | pypi | url | path
    url: str | None
    commit: str | None  # full commit (git, and a git ``path`` tree)
    sha256: str | None  # archive hash (pypi, url)
    version: str | None
    submodules: Mapping[str, str] = field(default_factory=dict)  # path in tree -> commit
    patches: tuple[tuple[str, str], ...] = ()  # (patch file, sha256) in effect, in order
    # When the source was made (commit time; newest member of an archive): the build's
    # SOURCE_DATE_EPOCH, so timestamps inside the wheel come from the source, not the clock.
    source_date_epoch: int | None = None
    # sha256 of how the tree differs from commit + patches (edits in third_party), None if clean
    dirty: str | None = None

    def fingerprint(self) -> str:
        """A hash of everything that defines the source: commit, submodules, archive, patches,
        and the edits made to the tree since."""
        data = {
            "kind": self.kind,
            "commit": self.commit,
            "sha256": self.sha256,
            "version": self.version,
            "submodules": sorted(self.submodules.items()),
            "patches": [list(p) for p in self.patches],
        }
        if self.dirty:  # only then: a clean tree keeps the fingerprint it always had
            data["dirty"] = self.dirty
        return json_sha256(data)

    def to_json(self) -> dict:
        """Plain values (for the stamp file and the lock)."""
        return {
            "package": self.package,
            "path": str(self.path),
            "project_dir": str(self.project_dir),
            "kind": self.kind,
            "url": self.url,
            "commit": self.commit,
            "sha256": self.sha256,
            "version": self.version,
            "submodules": dict(sorted(self.submodules.items())),
            "patches": [list(p) for p in self.patches],
            "source_date_epoch": self.source_date_epoch,
            "dirty": self.dirty,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> Checkout:
        """Inverse of :meth:`to_json`."""
        return cls(
            package=d["package"],
            path=Path(d["path"]),
            project_dir=Path(d["project_dir"]),
            kind=d["kind"],
            url=d["url"],
            commit=d["commit"],
            sha256=d["sha256"],
            version=d["version"],
            submodules=MappingProxyType(dict(d["submodules"])),
            patches=tuple((f, s) for f, s in d["patches"]),
            source_date_epoch=d.get("source_date_epoch"),
            dirty=d.get("dirty"),
        )


def prepare(cfg: Config, name: str, *, offline: bool = False) -> Checkout:
    """Make ``third_party/<name>`` hold exactly the pinned source with its patches applied.

    Reuses the tree when its stamp matches the pin and the patch set (no network, nothing
    written but the lock's holder line). Every failure is a one-line ``UserError`` that leaves
    the tree and the cache as they were.
    """
    pkg = cfg.package(name)
    src = pkg.source
    if src is None:
        raise UserError(f"packages.{name}: has no [source] (it is taken prebuilt); nothing to check out")
    bundle = bundle_dir()
    offline = offline or bundle is not None
    if src.kind == "path":
        return _local_tree(cfg, pkg, src)
    url, sha256 = src.url, src.sha256
    if src.kind == "rocm":
        # A tree of the ROCm install (amdsmi's share/amd_smi): named by its path and content.
        from rocmforge.host import find_rocm_installs

        located = rocm_tree(pkg, find_rocm_installs(environ=os.environ))
        url, sha256 = str(located), tree_sha256(located)
    pin = _effective_pin(cfg, pkg, offline=offline)
    version = pin.version
    selected = patchmod.select(cfg, pkg, version)
    key = {
        "stamp": STAMP_VERSION,
        "kind": src.kind,
        "url": url,
        "rev": src.rev,
        "commit": pin.commit,
        "submodules": src.submodules,
        "name": src.name,
        "version": version,
        "sha256": sha256,
        "subdir": src.subdir,
        "patches": [[s.file, s.sha256, s.workdir] for s in selected],
    }
    third_party = cfg.build.third_party
    tree = third_party / name
    stamp_path = third_party / f".{name}.stamp.json"
    with file_lock(third_party / f".{name}.lock", what=f"preparing {name}", on_wait=waiting(str(tree))):
        stamp = read_json(stamp_path)
        if not (stamp and stamp.get("key") == key and tree.is_dir()):
            _rebuild(cfg, pkg, pin, selected, key, tree, stamp_path, offline=offline, bundle=bundle)
            stamp = read_json(stamp_path)
        checkout = Checkout.from_json(stamp["checkout"])
        state = tree_state(tree, stamp.get("heads") or {}, checkout.submodules)
        checkout = replace(checkout, dirty=_as_built(cfg, checkout, state))
    _check_locked(cfg, checkout)
    return checkout


_READ_ONLY = {"GIT_OPTIONAL_LOCKS": "0"}  # status must not rewrite the index: a reused tree stays untouched


@dataclass(frozen=True)
class TreeState:
    """How a tree differs from what was checked out, file by file."""

    # "<submodule path>:<the file's diff header>" -> sha256 of that file's diff; empty: no difference
    files: Mapping[str, str]


_DIFF_HEADER = re.compile(rb"^(?=diff --git )", re.M)  # no hunk or base85 line starts like this


def tree_state(tree: Path, heads: Mapping[str, str], submodules: Mapping[str, str]) -> TreeState:
    """How ``tree`` differs from what was checked out (``heads``: repository path in the tree ->
    its commit after the patches).

    Counted: changes to tracked files and commits made since, in the tree and each submodule.
    Untracked files are build outputs as often as not (``build/``, ``*.egg-info``), so they do
    not count; ``git add`` a new file to count it. Content decides: an edit undone is clean.
    """
    paths = ["", *sorted(submodules)]
    # One git per repository: PyTorch has dozens of submodules, so they are asked side by side.
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        diffs = list(
            pool.map(lambda path: _repo_difference(tree / path if path else tree, heads.get(path)), paths)
        )
    files: dict[str, str] = {}
    for path, diff in zip(paths, diffs, strict=True):
        for chunk in filter(None, _DIFF_HEADER.split(diff)):
            header = chunk.split(b"\n", 1)[0].decode(errors="replace")
            files[f"{path}:{header}"] = hashlib.sha256(f"{path}\0".encode() + chunk).hexdigest()
    return TreeState(MappingProxyType(files))


def _repo_difference(where: Path, base: str | None) -> bytes:
    """``git diff --binary`` of one repository's work tree against ``base`` (default: HEAD)."""
    head = git.run(["rev-parse", "HEAD"], cwd=where, check=False).stdout.strip()
    base = base or head
    status = git.run(
        ["status", "--porcelain", "--untracked-files=no", "--ignore-submodules=all"],
        cwd=where,
        check=False,
        env=_READ_ONLY,
    )
    if head == base and not status.stdout.strip():
        return b""
    # Bytes, not text: an edited file need not be UTF-8.
    return subprocess.run(
        ["git", "diff", "--binary", "--ignore-submodules=all", base],
        cwd=where,
        capture_output=True,
        env={**os.environ, **git.ENV, **_READ_ONLY},
    ).stdout


# A build writes into its source tree, tracked files included: vLLM's sdist gets vllm/_version.py
# and vllm.egg-info/* rewritten (setuptools-scm, egg_info), PyTorch's HIPIFY rewrites sources in
# place. Taken as edits, they would mark the tree dirty and make every re-run rebuild. So after
# each build, every file the build changed is recorded by its diff, with what that file's diff
# was when the build started (None: the file was clean); a file found exactly as a build left it
# counts as it was then. A user's edit gives the file another diff and counts; undone, the file
# is back to a build's output and clean, even when the build writes other bytes each time (a
# timestamp). Restoring the files after the build was the alternative: it would overwrite what a
# user changes while a long build runs and touch mtimes that incremental builds go by, where a
# record changes nothing in the tree. What it cannot tell apart is an edit made while the build
# runs; the build names the files it changed for that reason.
_OUTPUTS_KEPT = 4096  # entries no file is in now (history for edits made and undone), at most


def _build_output_path(cfg: Config, name: str) -> Path:
    return cfg.build.third_party / f".{name}.build-output.json"


def _recorded_outputs(cfg: Config, checkout: Checkout) -> dict[str, str | None]:
    """sha256 of a file's diff as a build left it -> that file's diff when the build started."""
    record = read_json(_build_output_path(cfg, checkout.package)) or {}
    left = record.get("left") if record.get("tree") == str(checkout.path) else None
    return dict(left) if isinstance(left, dict) else {}


def _as_started(state: TreeState, outputs: Mapping[str, str | None]) -> dict[str, str]:
    """``state`` with each file that is as a build left it counted as it was when that build started."""
    counted = {name: outputs.get(h, h) for name, h in state.files.items()}
    return {name: h for name, h in counted.items() if h}


def _as_built(cfg: Config, checkout: Checkout, state: TreeState) -> str | None:
    """The dirty hash of ``checkout`` in ``state`` (None: clean), what the builds wrote left out."""
    if not state.files:
        return None
    counted = _as_started(state, _recorded_outputs(cfg, checkout))
    return json_sha256(sorted(counted.items())) if counted else None


def current_state(cfg: Config, checkout: Checkout) -> TreeState:
    """How ``checkout``'s tree differs from its pin and patches now (see :func:`tree_state`)."""
    if checkout.kind == "path":
        if checkout.commit is None:  # not a git tree: nothing to compare with
            return TreeState(MappingProxyType({}))
        return tree_state(checkout.path, {}, {})
    stamp = read_json(cfg.build.third_party / f".{checkout.package}.stamp.json") or {}
    return tree_state(checkout.path, stamp.get("heads") or {}, checkout.submodules)


def record_build_output(cfg: Config, checkout: Checkout, before: TreeState) -> list[str]:
    """Remember every file that the build of ``checkout`` changed since ``before``, so that the
    next run counts it as it was before; return their diff headers' paths."""
    after = current_state(cfg, checkout)
    outputs = _recorded_outputs(cfg, checkout)
    started = _as_started(before, outputs)
    changed = [n for n, h in after.files.items() if h not in outputs and before.files.get(n) != h]
    new = {after.files[n]: started.get(n) for n in changed}
    in_use = {h: outputs[h] for h in after.files.values() if h in outputs}
    older = [(h, v) for h, v in outputs.items() if h not in in_use]
    if new or older[_OUTPUTS_KEPT:]:
        record = {"tree": str(checkout.path), "left": dict(older[-_OUTPUTS_KEPT:]) | in_use | new}
        atomic_write(_build_output_path(cfg, checkout.package), json.dumps(record, indent=0))
    return [_shown(n) for n in changed]


def _shown(name: str) -> str:
    """The path of a :class:`TreeState` file name, for people."""
    submodule, header = name.split(":", 1)
    path = header.removeprefix("diff --git a/").split(" b/")[0]
    return f"{submodule}/{path}" if submodule else path


def existing(cfg: Config, name: str) -> Checkout | None:
    """The checkout :func:`prepare` made last for ``name``, without fetching or patching anything;
    None when there is none yet. For readers that must not touch the network (``env PKG``)."""
    pkg = cfg.package(name)
    if pkg.source is None:
        return None
    if pkg.source.kind == "path":
        return _local_tree(cfg, pkg, pkg.source)
    stamp = read_json(cfg.build.third_party / f".{name}.stamp.json")
    tree = cfg.build.third_party / name
    return Checkout.from_json(stamp["checkout"]) if stamp and tree.is_dir() else None


@dataclass(frozen=True)
class _Pin:
    commit: str | None  # what the commit must be (config, derived pin or lock); may be abbreviated
    version: str | None


def _effective_pin(cfg: Config, pkg: Package, *, offline: bool) -> _Pin:
    """The commit and version to check out: config, then a derived pin, then the lock in locked mode."""
    src = pkg.source
    commit = src.commit
    version = src.version if src.kind == "pypi" else pkg.version
    if pkg.pin_from:
        # Checking out Triton fetches PyTorch first: say why, it may take a while.
        console.print(
            f"{pkg.pin_from}: needed because {pkg.name}'s pin comes from it ({PYTORCH_TRITON_COMMIT})",
            markup=False,
        )
        derived_commit, derived_version = derived_pin(cfg, pkg, offline=offline)
        commit, version = _merge_derived(pkg, derived_commit, derived_version)
    locked = lock.locked_entry(cfg, pkg.name)
    if locked is not None and commit is None:
        commit = locked.get("commit")
    return _Pin(commit=commit, version=version)


def derived_pin(cfg: Config, pkg: Package, *, offline: bool = False) -> tuple[str, str | None]:
    """(commit, version) that ``pkg.pin_from``'s tree records for ``pkg`` (Triton inside PyTorch)."""
    parent = prepare(cfg, pkg.pin_from, offline=offline)
    commit_file = parent.path / PYTORCH_TRITON_COMMIT
    version_file = parent.path / PYTORCH_TRITON_VERSION
    try:
        commit = commit_file.read_text().strip()
    except FileNotFoundError:
        raise UserError(
            f"packages.{pkg.name}.pin_from: {pkg.pin_from}'s tree has no {PYTORCH_TRITON_COMMIT}; "
            f"remove pin_from and pin {pkg.name} yourself"
        ) from None
    if not HEX_RE.match(commit):
        raise UserError(f"{commit_file}: {commit!r} is not a commit id; remove pin_from and pin yourself")
    version = version_file.read_text().strip() if version_file.is_file() else None
    return commit, version


def _merge_derived(pkg: Package, commit: str, version: str | None) -> tuple[str, str | None]:
    ours_commit, ours_version = pkg.source.commit, pkg.version
    src_name = f"{pkg.pin_from}'s {PYTORCH_TRITON_COMMIT}"
    if ours_commit and not (commit.startswith(ours_commit) or ours_commit.startswith(commit)):
        if pkg.override_pin:
            console.print(
                f"{pkg.name}: keeping commit {ours_commit} over {commit} from {src_name} (override_pin)"
            )
            return ours_commit, ours_version
        raise UserError(
            f"packages.{pkg.name}.source.commit = {ours_commit} but {src_name} pins {commit}; "
            f"set commit = {commit!r}, or override_pin = true to keep yours"
        )
    if ours_version and version and not _same_version(ours_version, version):
        if pkg.override_pin:
            return commit, ours_version
        raise UserError(
            f"packages.{pkg.name}.version = {ours_version} but {pkg.pin_from}'s {PYTORCH_TRITON_VERSION} "
            f"says {version}; set version = {version!r}, or override_pin = true to keep yours"
        )
    return commit, version or ours_version


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a).release == Version(b).release
    except InvalidVersion:
        return a == b


def _check_locked(cfg: Config, checkout: Checkout) -> None:
    lock.check_checkout(cfg, checkout)


# --------------------------------------------------------------------------- rebuilding a tree


def _rebuild(cfg, pkg, pin, selected, key, tree, stamp_path, *, offline, bundle) -> Checkout:
    """Fetch what is missing, dry-run the patches, then (only then) change the tree."""
    src = pkg.source
    cache = cfg.build.cache_dir
    tree.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(tree)
    if src.kind == "git":
        root = resolve_repo(
            cache, src.url, src.rev, pin.commit, "", src.submodules, offline, bundle, pkg.name
        )
        plan = patchmod.dry_run(selected, git_dirs(root))
        stamp_path.unlink(missing_ok=True)
        materialize(tree, root)
        base_commit, url, sha256 = root.commit, src.url, None
        submodules = {r.path: r.commit for r in walk(root) if r.path}
        epoch = commit_time(root.commit, git_dir=root.mirror)
    else:
        if src.kind == "rocm":
            url, digest = key["url"], key["sha256"]

            def fill(staging: Path) -> str:
                return import_directory(Path(url), staging)
        else:
            url, filename = archive_location(pkg, src, offline=offline)
            archive = cached_archive(
                cache, url, filename, src.sha256, offline=offline, bundle=bundle, what=pkg.name
            )
            digest = src.sha256

            def fill(staging: Path) -> str:
                return import_archive(archive, staging, what=pkg.name)

        base_commit = reusable_import(stamp_path, tree, digest)
        staging = None
        try:
            if base_commit is None:
                staging = Path(tempfile.mkdtemp(prefix=f".{tree.name}.tmp-", dir=tree.parent))
                base_commit = fill(staging)
            plan = patchmod.dry_run(selected, {"": ((staging or tree) / ".git", base_commit)})
        except BaseException:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        stamp_path.unlink(missing_ok=True)
        if staging:
            replace_tree(staging, tree)
        else:
            reset_tree(tree, base_commit)
        commit, sha256, submodules = None, digest, {}
        # A ROCm install has no date of its own to give; an archive has its members'.
        epoch = None if src.kind == "rocm" else archive_time(archive, what=pkg.name)
    applied = patchmod.apply(plan, tree)
    checkout = Checkout(
        package=pkg.name,
        path=tree,
        project_dir=tree / src.subdir if src.subdir else tree,
        kind=src.kind,
        url=url,
        commit=base_commit if src.kind == "git" else commit,
        sha256=sha256,
        version=pin.version,
        submodules=MappingProxyType(dict(sorted(submodules.items()))),
        patches=tuple((s.file, s.sha256) for s in applied),
        source_date_epoch=epoch,
    )
    heads = {
        path: git.run(["rev-parse", "HEAD"], cwd=tree / path if path else tree).stdout.strip()
        for path in ["", *checkout.submodules]
    }
    stamp = {"key": key, "base": base_commit, "checkout": checkout.to_json(), "heads": heads}
    atomic_write(stamp_path, json.dumps(stamp, indent=1))
    return checkout


def commit_time(commit: str, *, git_dir: Path | None = None, cwd: Path | None = None) -> int:
    """The committer time of ``commit`` in seconds since 1970 (what ``git log --format=%ct`` says)."""
    return int(git.run(["show", "-s", "--format=%ct", commit], git_dir=git_dir, cwd=cwd).stdout.strip())


def archive_time(archive: Path, *, what: str) -> int | None:
    """The newest modification time among ``archive``'s members (an sdist's build time).

    setuptools, hatchling and flit stamp sdist members with the time they were made (or
    with their own SOURCE_DATE_EPOCH), so this is the archive's own date, the same on every
    machine, where the file's mtime in our cache would be the download's.
    """
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                stamps = [calendar.timegm((*i.date_time, 0, 0, 0)) for i in zf.infolist()]
        else:
            with tarfile.open(archive) as tf:
                stamps = [int(m.mtime) for m in tf.getmembers()]
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise UserError(
            f"{what}: {archive.name} is not a readable archive ({exc}); check the url and sha256"
        ) from None
    return max(stamps, default=None)


def _remove_leftovers(tree: Path) -> None:
    """Delete half-built trees of a killed run (we hold the checkout lock, so nobody uses them)."""
    for p in tree.parent.glob(f".{tree.name}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in tree.parent.glob(f".{tree.name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------- local trees


def _local_tree(cfg: Config, pkg: Package, src: Source) -> Checkout:
    """A ``path`` source is used as it is: recorded, never modified (so no patches)."""
    if not src.path.is_dir():
        raise UserError(f"packages.{pkg.name}.source.path: {src.path} is not a directory")
    if pkg.patches:
        raise UserError(
            f"packages.{pkg.name}.patches: a local tree is used as it is; apply the patches there yourself "
            "and remove them from the config"
        )
    commit = None
    if git.run(["rev-parse", "--git-dir"], cwd=src.path, check=False).returncode == 0:
        commit = git.run(["rev-parse", "HEAD"], cwd=src.path).stdout.strip()
    epoch = commit_time(commit, cwd=src.path) if commit else None
    checkout = Checkout(
        package=pkg.name,
        path=src.path,
        project_dir=src.path / src.subdir if src.subdir else src.path,
        kind="path",
        url=None,
        commit=commit,
        sha256=None,
        version=pkg.version,
        submodules=MappingProxyType({}),
        patches=(),
        source_date_epoch=epoch,
    )
    # uncommitted edits: the commit alone is not the tree
    return replace(checkout, dirty=_as_built(cfg, checkout, current_state(cfg, checkout)))


# --------------------------------------------------------------------------- the lock session


def prepare_all(cfg: Config, *, offline: bool = False) -> list[Checkout]:
    """Every package built from source, prepared (checked out and patched) in build order."""
    return [prepare(cfg, n, offline=offline) for n in cfg.build_order() if cfg.package(n).source is not None]


def write_lock(cfg: Config, *, offline: bool = False, locked: bool | None = None) -> Path:
    """Prepare every package and write ``rocmforge.lock.toml`` (atomically); in locked mode
    refuse any difference instead."""
    locked = lock.locked_mode() if locked is None else locked
    path = lock.lock_path(cfg)
    if path.exists() and not path.is_file():  # found before the checkouts, not at the final rename
        raise UserError(f"{path} is not a file; remove it and run `nox -s lock` again")
    # The guard lives with the checkouts (git-ignored), not next to the committed lock file.
    with file_lock(cfg.build.third_party / f".{lock.LOCK_FILE}.lock", what="writing the lock"):
        packages = {co.package: lock.package_entry(co) for co in prepare_all(cfg, offline=offline)}
        from rocmforge import host

        data = {"toolchain": lock.toolchain_facts(host.facts(cfg.build.work_dir)), "packages": packages}
        if locked:
            for name, entry in packages.items():
                lock.refuse_dirty(name, cfg.build.third_party / name, entry.get("dirty"))
            existing = lock.read_lock(cfg)
            if existing is None:
                raise UserError(f"locked mode but {path} does not exist; run `nox -s lock` first")
            lock.require_same(existing, data, "")
            console.print(f"{path.name}: everything matches")
            return path
        text = lock.render(data)
        if path.is_file() and path.read_text() == text:
            console.print(f"{path.name}: unchanged")
        else:
            atomic_write(path, text)
            console.print(f"wrote {path}")
    return path


def lock_session(session, cfg: Config) -> None:
    """``nox -s lock [-- --locked] [--offline]``."""
    args = set(session.posargs)
    unknown = args - {"--locked", "--offline"}
    if unknown:
        session.error(f"unknown arguments {sorted(unknown)}; use --locked and/or --offline")
    write_lock(cfg, offline="--offline" in args, locked=True if "--locked" in args else None)


# --------------------------------------------------------------------------- command line


def add_arguments(parser) -> None:
    """``python -m rocmforge checkout [PACKAGE ...] [--offline] [--json]``."""
    parser.add_argument("packages", nargs="*", help="packages to check out (default: all built from source)")
    parser.add_argument("--offline", action="store_true", help="never use the network (cache or export only)")
    parser.add_argument("--json", action="store_true", help="print each checkout as JSON")


def main(args) -> int:
    """Prepare the checkouts and say what each one holds."""
    from rocmforge.config import load_config

    cfg = load_config()
    names = args.packages or [n for n in cfg.build_order() if cfg.package(n).source is not None]
    for name in names:
        co = prepare(cfg, name, offline=args.offline)
        if args.json:
            print(json.dumps({**co.to_json(), "fingerprint": co.fingerprint()}))
        else:
            pin = co.commit or co.sha256 or "local tree"
            extra = f", {len(co.submodules)} submodules" if co.submodules else ""
            extra += f", {len(co.patches)} patches" if co.patches else ""
            print(f"{name}: {co.path} at {pin}{extra}")
    return 0
