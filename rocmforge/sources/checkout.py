"""Pinned sources: fetch, verify and check out each package's source into ``third_party/<pkg>``.

One per-user cache (``build.cache_dir``) is shared by every checkout::

    <cache>/git/<slug>.git         a bare mirror per URL; commits fetched shallowly by sha
    <cache>/git/<slug>.pins.json   which (rev, commit) pairs were verified against the server
    <cache>/archives/<sha256>/<f>  downloaded sdists and archives, stored under their hash

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
import contextlib
import fnmatch
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType

from packaging.utils import canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from rocmforge.config import Config, Package, Source
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, file_sha256, json_sha256, read_json
from rocmforge.sources import git, lock
from rocmforge.sources import patches as patchmod

# Seconds to wait before each retry of a network operation; the last failure is reported.
RETRY_DELAYS: tuple[float, ...] = (2.0, 5.0, 15.0)
BUNDLE_ENV = "ROCMFORGE_OFFLINE_BUNDLE"
BUNDLE_WHEELS = "wheels"  # the export's wheels for the build venvs (sources/export.py writes them)
STAMP_VERSION = 2
_HEX_RE = re.compile(r"^[0-9a-f]{7,40}$")
# git's messages for a connection that failed or broke: worth a retry, unlike a refused request.
_TRANSIENT_RE = re.compile(
    r"unable to connect|connection (refused|reset|timed out|closed)|could not resolve host|early eof"
    r"|hung up unexpectedly|rpc failed|timed out|temporary failure|network is unreachable"
    r"|could not read from remote repository|unexpected disconnect|broken pipe|invalid packet",
    re.IGNORECASE,
)
# A name that does not resolve: no DNS on this machine (air-gapped, offline). Retrying rarely
# helps and cost 22 s before the same answer, so it is one line at once.
_UNRESOLVED_RE = re.compile(
    r"could not resolve host|name or service not known|temporary failure in name resolution"
    r"|no address associated with hostname|nodename nor servname",
    re.IGNORECASE,
)
_OFFLINE_FIX = (
    "check the connection, or build offline from a filled cache or an export (README: Air-gapped clusters)"
)
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
    bundle = _bundle_dir()
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
    with file_lock(third_party / f".{name}.lock", what=f"preparing {name}", on_wait=_waiting(str(tree))):
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
    if not _HEX_RE.match(commit):
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
        root = _resolve_repo(
            cache, src.url, src.rev, pin.commit, "", src.submodules, offline, bundle, pkg.name
        )
        plan = patchmod.dry_run(selected, _git_dirs(root))
        stamp_path.unlink(missing_ok=True)
        _materialize(tree, root)
        base_commit, url, sha256 = root.commit, src.url, None
        submodules = {r.path: r.commit for r in _walk(root) if r.path}
        epoch = commit_time(root.commit, git_dir=root.mirror)
    else:
        if src.kind == "rocm":
            url, digest = key["url"], key["sha256"]

            def fill(staging: Path) -> str:
                return _import_directory(Path(url), staging)
        else:
            url, filename = _archive_location(pkg, src, offline=offline)
            archive = _fetch_archive(
                cache, url, filename, src.sha256, offline=offline, bundle=bundle, what=pkg.name
            )
            digest = src.sha256

            def fill(staging: Path) -> str:
                return _import_archive(archive, staging, what=pkg.name)

        base_commit = _reusable_import(stamp_path, tree, digest)
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
            _replace_tree(staging, tree)
        else:
            _reset(tree, base_commit)
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


def _replace_tree(staging: Path, tree: Path) -> None:
    """Swap a finished tree into place: rename is atomic, deleting the old one comes after."""
    old = None
    if tree.exists():
        old = tree.parent / f".{tree.name}.old-{os.getpid()}"
        os.replace(tree, old)
    os.replace(staging, tree)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _waiting(what: str):
    def say(holder: str) -> None:
        console.print(f"waiting for {what}: held by {holder or 'another run'}")

    return say


# --------------------------------------------------------------------------- git


def _remote(args: list[str], *, git_dir: Path, what: str):
    """Run a git command that talks to a server, retrying connection failures with backoff.

    Returns the last completed process; raises when every attempt failed for network reasons.
    """
    for delay in (*RETRY_DELAYS, None):
        proc = git.run(args, git_dir=git_dir, check=False)
        if proc.returncode != 0 and _UNRESOLVED_RE.search(proc.stderr):
            raise UserError(f"{what}: {git.last_line(proc.stderr)}; {_OFFLINE_FIX}")
        if proc.returncode == 0 or not _TRANSIENT_RE.search(proc.stderr):
            return proc
        # git says "could not read from remote repository" for a missing local repository
        # too; waiting will not make a path appear, so only remote servers are retried.
        url = git.run(["config", "--get", "remote.origin.url"], git_dir=git_dir, check=False).stdout.strip()
        if url.startswith("file://") or url.startswith("/"):
            raise UserError(
                f"{what}: {url} is not a readable git repository ({git.last_line(proc.stderr)}); "
                "fix the source url in the config"
            )
        if delay is None:
            raise UserError(
                f"{what}: network error after {len(RETRY_DELAYS) + 1} attempts: "
                f"{git.last_line(proc.stderr)}; {_OFFLINE_FIX}"
            )
        console.print(f"{what}: {git.last_line(proc.stderr)}; retrying in {delay:g} s")
        time.sleep(delay)
    raise AssertionError("unreachable")


def mirror_path(cache: Path, url: str) -> Path:
    """The bare mirror of ``url`` in the cache (readable name plus a hash of the full URL)."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1]).strip("_")[-60:]
    return cache / "git" / f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"


@dataclass(frozen=True)
class _Repo:
    """One repository of a checkout: the superproject (path "") or a submodule."""

    path: str  # relative to the tree root
    url: str
    mirror: Path
    commit: str
    children: tuple[_Repo, ...] = ()


def bundle_name(mirror: Path) -> str:
    """File name of ``mirror``'s git bundle inside an export."""
    return mirror.name.removesuffix(".git") + ".bundle"


def git_repositories(cfg: Config, checkout: Checkout) -> list[tuple[str, str]]:
    """(url, commit) of a git checkout's repository and of every submodule in it, recursively."""
    src = cfg.package(checkout.package).source
    found = []

    def visit(url: str, commit: str) -> None:
        found.append((url, commit))
        if src.submodules:
            for _path, sub_url, sub_commit in _submodules_of(
                mirror_path(cfg.build.cache_dir, url), commit, url
            ):
                visit(sub_url, sub_commit)

    visit(checkout.url, checkout.commit)
    return found


def _walk(repo: _Repo) -> Iterator[_Repo]:
    yield repo
    for child in repo.children:
        yield from _walk(child)


def _git_dirs(root: _Repo) -> dict[str, tuple[Path, str]]:
    return {r.path: (r.mirror, r.commit) for r in _walk(root)}


def _resolve_repo(cache, url, rev, pin, path, submodules, offline, bundle, what) -> _Repo:
    """Make the mirror hold the pinned commit and, recursively, every submodule's commit."""
    mirror = mirror_path(cache, url)
    label = f"{what}{'/' + path if path else ''}"
    commit = _ensure_commit(mirror, url, rev, pin, offline=offline, bundle=bundle, what=label)
    children: tuple[_Repo, ...] = ()
    if submodules:
        subs = _submodules_of(mirror, commit, url)
        if subs:
            with ThreadPoolExecutor(max_workers=min(8, len(subs))) as pool:
                futures = [
                    pool.submit(
                        _resolve_repo,
                        cache,
                        sub_url,
                        None,
                        sub_commit,
                        f"{path}/{sub_path}" if path else sub_path,
                        True,
                        offline,
                        bundle,
                        what,
                    )
                    for sub_path, sub_url, sub_commit in subs
                ]
                children = tuple(f.result() for f in futures)
    return _Repo(path=path, url=url, mirror=mirror, commit=commit, children=children)


def _submodules_of(mirror: Path, commit: str, url: str) -> list[tuple[str, str, str]]:
    """(path, url, commit) of each submodule recorded in ``commit`` (relative URLs resolved)."""
    proc = git.run(
        ["config", "--blob", f"{commit}:.gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$"],
        git_dir=mirror,
        check=False,
    )
    if proc.returncode != 0:
        return []
    paths: dict[str, str] = {}
    urls: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        k, _, v = line.partition(" ")
        name, _, attr = k[len("submodule.") :].rpartition(".")
        (paths if attr == "path" else urls)[name] = v
    by_path = {paths[n]: urls[n] for n in paths if n in urls}
    if not by_path:
        return []
    tree = git.run(["ls-tree", "-z", commit, "--", *by_path], git_dir=mirror).stdout
    result = []
    for entry in filter(None, tree.split("\0")):
        meta, _, p = entry.partition("\t")
        _mode, kind, sha = meta.split()
        if kind == "commit":
            result.append((p, resolve_url(url, by_path[p]), sha))
    return sorted(result)


def resolve_url(base: str, rel: str) -> str:
    """A submodule URL as git resolves it: ``../x.git`` is relative to the superproject's URL."""
    if not rel.startswith(("./", "../")):
        return rel
    base = base.rstrip("/")
    while True:
        if rel.startswith("./"):
            rel = rel[2:]
        elif rel.startswith("../"):
            rel = rel[3:]
            base = base.rsplit("/", 1)[0]
        else:
            return f"{base}/{rel}"


def _ensure_commit(mirror: Path, url, rev, pin, *, offline, bundle, what) -> str:
    """The full commit ``rev``/``pin`` stand for, present in ``mirror`` (fetched if needed)."""
    lock = mirror.with_suffix(".lock")
    with file_lock(lock, what=f"fetching {url}", on_wait=_waiting(str(mirror))):
        created = not mirror.exists()
        if created:
            _create_mirror(mirror, url)
        try:
            return _ensure_commit_locked(mirror, url, rev, pin, offline=offline, bundle=bundle, what=what)
        except BaseException:
            if created:  # leave the cache as it was: no empty mirror behind a failed first fetch
                shutil.rmtree(mirror, ignore_errors=True)
            raise


def _ensure_commit_locked(mirror: Path, url, rev, pin, *, offline, bundle, what) -> str:
    pins_file = mirror.with_suffix(".pins.json")
    pins = read_json(pins_file) or {}
    record = f"{rev or ''}@{pin or ''}"
    known = _pinned(pins, record, pin, pins_file)
    # A floating rev (no commit pinned) is asked for again whenever the network is there.
    if known and (pin or offline) and _has_commit(mirror, known):
        return known
    if rev is None and pin and len(pin) == 40 and _has_commit(mirror, pin):
        return pin
    if offline:
        known = _offline_commit(mirror, url, rev, pin, bundle=bundle, what=what, record=record)
    else:
        known = _fetch_pinned(mirror, url, rev, pin, what=what)
    pins[record] = known
    atomic_write(pins_file, json.dumps(pins, indent=1, sort_keys=True))
    return known


def _create_mirror(mirror: Path, url: str) -> None:
    """An empty bare repository; built under a temp name so a killed run leaves nothing half-made."""
    mirror.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{mirror.name}.tmp-", dir=mirror.parent))
    try:
        git.run(["init", "-q", "--bare", str(tmp)])
        git.run(["config", "remote.origin.url", url], git_dir=tmp)
        # Mirrors only ever grow by fetches of pinned commits; automatic gc would just cost time.
        git.run(["config", "gc.auto", "0"], git_dir=tmp)
        os.replace(tmp, mirror)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _pinned(pins: Mapping, record: str, pin: str | None, pins_file: Path) -> str | None:
    """The commit the cache's pin map records for ``record``, if it is the pinned commit.

    The map is a cache: an entry naming another commit than the pin (edited, or damaged) is
    said once and ignored, so the commit is resolved again instead of built.
    """
    known = pins.get(record)
    if not isinstance(known, str) or len(known) != 40:
        return None
    if pin and not known.startswith(pin):
        console.print(
            f"{pins_file}: records {known} for {record}, not the pinned commit {pin}; not using it",
            markup=False,
            soft_wrap=True,
        )
        return None
    return known


def _has_commit(mirror: Path, commit: str) -> bool:
    return git.run(["cat-file", "-e", f"{commit}^{{commit}}"], git_dir=mirror, check=False).returncode == 0


def _offline_commit(mirror: Path, url, rev, pin, *, bundle, what, record) -> str:
    if bundle is not None:
        import_bundle(bundle, mirror, url)
        pins_file = mirror.with_suffix(".pins.json")
        known = _pinned(read_json(pins_file) or {}, record, pin, pins_file)
        if known and _has_commit(mirror, known):
            return known
    commit = git.resolve(pin, git_dir=mirror) if pin else None
    if commit is None:
        where = f"the export {bundle}" if bundle else f"the cache ({mirror})"
        wanted = f"commit {pin}" if pin else f"rev {rev!r}"
        raise UserError(
            f"{what}: offline, and {wanted} of {url} is not in {where}; "
            "run once with network (or make a new export with `nox -s export`)"
        )
    return commit


def _fetch_pinned(mirror: Path, url, rev, pin, *, what) -> str:
    """Ask the server what ``rev`` is, check it against ``pin`` and fetch that commit."""
    target = pin if pin and len(pin) == 40 else None
    branch = None
    if rev is not None:
        kind, sha = _ls_remote(mirror, url, rev, what=what)
        if kind == "commit":
            if pin and not (rev.startswith(pin) or pin.startswith(rev)):
                raise UserError(f"{what}: rev {rev} and commit {pin} name different commits; keep one")
            target = target or (rev if len(rev) == 40 else None)
        elif pin is None or sha.startswith(pin):
            target = sha
        elif kind == "branch":
            branch = rev  # the branch moved on; the pin must still be on it (checked below)
        else:
            raise UserError(
                f"{what}: rev {rev!r} resolves to {sha} at {url}, not to the pinned commit {pin}; "
                "fix commit or rev in the config"
            )
    if target is not None:
        _fetch_commit(mirror, target, what=what)
    elif branch is not None:
        _deepen_until(mirror, branch, pin, what=what)
    else:
        # An abbreviated commit cannot be asked for by id: fetch the refs and resolve locally.
        _fetch_all(mirror, what=what)
    full = git.resolve(target or pin or rev, git_dir=mirror)
    if full is None:
        raise UserError(f"{what}: commit {target or pin or rev} not found at {url}; check the pin")
    if branch is not None:
        _check_on_branch(mirror, full, branch, what=what, url=url)
    git.run(["update-ref", f"refs/rocmforge/{full}", full], git_dir=mirror)
    return full


def _deepen_until(mirror: Path, branch: str, pin: str, *, what: str) -> None:
    """Find an abbreviated ``pin`` in ``branch``'s recent history, fetching deeper each time.

    A pin is usually close to its branch's tip, so this costs far less than the full history
    (which is the last resort).
    """
    ref = f"+refs/heads/{branch}:refs/rocmforge/branches/{branch}"
    for depth in (100, 2000, 20000):
        console.print(f"{what}: looking for {pin} in the last {depth} commits of {branch}")
        proc = _remote(
            ["fetch", "-q", "--no-write-fetch-head", "--depth", str(depth), "origin", ref],
            git_dir=mirror,
            what=what,
        )
        if proc.returncode != 0:
            raise UserError(f"{what}: fetch of branch {branch!r} failed: {git.last_line(proc.stderr)}")
        if git.resolve(pin, git_dir=mirror):
            return
    _fetch_all(mirror, what=what)


def _ls_remote(mirror: Path, url: str, rev: str, *, what: str) -> tuple[str, str | None]:
    """('tag'|'branch'|'ref', commit) for a ref called ``rev``, or ('commit', None) for a hex id."""
    proc = _remote(["ls-remote", "origin", rev, f"{rev}^{{}}"], git_dir=mirror, what=what)
    if proc.returncode != 0:
        raise UserError(f"{what}: cannot list refs of {url}: {git.last_line(proc.stderr)}")
    refs = {name: sha for sha, name in (ln.split("\t", 1) for ln in proc.stdout.splitlines() if "\t" in ln)}
    for name, kind in (
        (f"refs/tags/{rev}^{{}}", "tag"),
        (f"refs/tags/{rev}", "tag"),
        (f"refs/heads/{rev}", "branch"),
        (rev, "ref"),
    ):
        if name in refs:
            return kind, refs[name]
    if _HEX_RE.match(rev):
        return "commit", None
    raise UserError(f"{what}: rev {rev!r} is neither a branch, a tag nor a commit at {url}; fix the rev")


def _fetch_commit(mirror: Path, commit: str, *, what: str) -> None:
    """Fetch one commit by id, shallowly; servers that refuse that get a full fetch instead."""
    if _has_commit(mirror, commit):
        return
    console.print(f"{what}: fetching {commit[:12]} (shallow)")
    proc = _remote(
        ["fetch", "-q", "--no-write-fetch-head", "--depth", "1", "origin", commit], git_dir=mirror, what=what
    )
    if proc.returncode != 0:
        console.print(
            f"{what}: the server refused a fetch by id ({git.last_line(proc.stderr)}); fetching all refs"
        )
        _fetch_all(mirror, what=what)


def _fetch_all(mirror: Path, *, what: str) -> None:
    shallow = ["--unshallow"] if (mirror / "shallow").exists() else []
    proc = _remote(
        [
            "fetch",
            "-q",
            "--no-write-fetch-head",
            *shallow,
            "origin",
            "+refs/heads/*:refs/heads/*",
            "+refs/tags/*:refs/tags/*",
        ],
        git_dir=mirror,
        what=what,
    )
    if proc.returncode != 0:
        raise UserError(f"{what}: fetch failed: {git.last_line(proc.stderr)}")


def _check_on_branch(mirror: Path, commit: str, branch: str, *, what: str, url: str) -> None:
    """A branch moves on: the pinned commit must be on it, not necessarily its tip.

    Only the branch's commits newer than the pin are fetched (``--shallow-since``); if that
    history is not enough (odd commit dates), the whole branch is fetched before giving up.
    """
    ref = f"refs/rocmforge/branches/{branch}"
    date = git.run(["show", "-s", "--format=%ct", commit], git_dir=mirror).stdout.strip()
    for extra in (["--shallow-since", str(int(date) - 1)], None):
        if extra is None:
            extra = ["--unshallow"] if (mirror / "shallow").exists() else []
        proc = _remote(
            ["fetch", "-q", "--no-write-fetch-head", *extra, "origin", f"+refs/heads/{branch}:{ref}"],
            git_dir=mirror,
            what=what,
        )
        if proc.returncode != 0:
            raise UserError(f"{what}: fetch of branch {branch!r} failed: {git.last_line(proc.stderr)}")
        if git.run(["merge-base", "--is-ancestor", commit, ref], git_dir=mirror, check=False).returncode == 0:
            return
    tip = git.resolve(ref, git_dir=mirror)
    raise UserError(
        f"{what}: rev {branch!r} (now {tip}) does not contain the pinned commit {commit} at {url}; "
        "fix commit or rev in the config"
    )


def _materialize(tree: Path, root: _Repo) -> None:
    """Check every repository of ``root`` out under ``tree``; a new tree is built aside and renamed."""
    if git.is_work_tree(tree):
        _checkout_all(tree, root)
        return
    staging = Path(tempfile.mkdtemp(prefix=f".{tree.name}.tmp-", dir=tree.parent))
    try:
        _checkout_all(staging, root)
        _replace_tree(staging, tree)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _checkout_all(tree: Path, repo: _Repo) -> None:
    where = tree / repo.path if repo.path else tree
    _checkout_repo(where, repo.mirror, repo.commit)
    if repo.children:
        with ThreadPoolExecutor(max_workers=min(8, len(repo.children))) as pool:
            for f in [pool.submit(_checkout_all, tree, child) for child in repo.children]:
                f.result()


def _checkout_repo(where: Path, mirror: Path, commit: str) -> None:
    """A work tree at ``commit`` whose objects come from ``mirror``; reused trees are reset clean."""
    git_dir = where / ".git"
    if not git.is_work_tree(where) or not (git_dir / "objects" / "info" / "alternates").is_file():
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        git.run(["init", "-q", str(where)])
    atomic_write(git_dir / "objects" / "info" / "alternates", f"{mirror / 'objects'}\n")
    shallow = mirror / "shallow"
    if shallow.exists():
        atomic_write(git_dir / "shallow", shallow.read_bytes())
    # A run killed inside git leaves its index lock; we hold the checkout lock, so it is stale.
    (git_dir / "index.lock").unlink(missing_ok=True)
    _reset(where, commit)


def _reset(where: Path, commit: str) -> None:
    """Make ``where`` exactly ``commit``: tracked files restored, untracked and ignored files gone."""
    git.run(["checkout", "-q", "-f", "--detach", commit], cwd=where)
    git.run(["clean", "-q", "-ffdx"], cwd=where)


def import_bundle(bundle: Path, mirror: Path, url: str) -> None:
    """Fetch ``url``'s objects from an export (``nox -s export``) into ``mirror``."""
    src = bundle / "git" / bundle_name(mirror)
    if not src.is_file():
        return
    shallow = src.with_suffix(".shallow")
    if shallow.is_file():
        # The bundle holds shallow history: tell git where it ends, or it looks for the parents.
        have = (mirror / "shallow").read_text().split() if (mirror / "shallow").exists() else []
        atomic_write(
            mirror / "shallow", "".join(f"{c}\n" for c in sorted({*have, *shallow.read_text().split()}))
        )
    git.run(
        ["fetch", "-q", "--no-write-fetch-head", str(src), "+refs/rocmforge/*:refs/rocmforge/*"],
        git_dir=mirror,
    )
    pins = {
        **(read_json(src.with_suffix(".pins.json")) or {}),
        **(read_json(mirror.with_suffix(".pins.json")) or {}),
    }
    atomic_write(mirror.with_suffix(".pins.json"), json.dumps(pins, indent=1, sort_keys=True))


def _bundle_dir() -> Path | None:
    value = os.environ.get(BUNDLE_ENV)
    if not value:
        return None
    path = Path(value).expanduser().resolve()
    if not (path / "rocmforge.lock.toml").is_file():
        raise UserError(
            f"{BUNDLE_ENV}={value}: not an export (no rocmforge.lock.toml); make one with `nox -s export`"
        )
    return path


def offline_index_args(environ=None) -> list[str]:
    """uv/pip arguments that make an install use only the export's wheels, when building from
    one (``ROCMFORGE_OFFLINE_BUNDLE``); none otherwise."""
    environ = os.environ if environ is None else environ
    export_dir = environ.get(BUNDLE_ENV)
    if not export_dir:
        return []
    return ["--no-index", "--find-links", str(Path(export_dir) / BUNDLE_WHEELS)]


# --------------------------------------------------------------------------- archives


def _archive_location(pkg: Package, src: Source, *, offline: bool) -> tuple[str | None, str | None]:
    """(download URL, file name); the URL of a PyPI sdist comes from pip's configured index."""
    if src.kind == "url":
        return src.url, Path(urllib.parse.urlsplit(src.url).path).name or f"{pkg.name}.tar.gz"
    if offline:
        return None, None  # the file name comes from the cache or the export
    return _sdist_url(src.name, src.version, src.sha256, what=pkg.name)


def pip_index_url() -> str:
    """The index pip would use: ``PIP_INDEX_URL``, else pip's config ``index-url``, else PyPI."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    proc = subprocess.run(
        [os.environ.get("PYTHON", "python3"), "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    for line in proc.stdout.splitlines():
        k, _, v = line.partition("=")
        if k.endswith(".index-url"):
            return v.strip().strip("'\"")
    return "https://pypi.org/simple/"


class _Links(HTMLParser):
    """Anchors of a PEP 503 simple-index page."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def sdist_files(name: str, *, what: str) -> list[tuple[str, str, str | None]]:
    """(file name, URL, sha256 the index lists or None) of every sdist of ``name`` on pip's index."""
    page = f"{pip_index_url().rstrip('/')}/{canonicalize_name(name)}/"
    body, ctype = _http_get(page, what=what, accept="application/vnd.pypi.simple.v1+json, text/html;q=0.1")
    files: list[tuple[str, str, str | None]] = []
    if "json" in ctype:
        for f in json.loads(body)["files"]:
            files.append(
                (f["filename"], urllib.parse.urljoin(page, f["url"]), f.get("hashes", {}).get("sha256"))
            )
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for text, href in parser.links:
            url, _, frag = urllib.parse.urljoin(page, href).partition("#")
            files.append((text, url, frag[len("sha256=") :] if frag.startswith("sha256=") else None))
    return [f for f in files if f[0].endswith((".tar.gz", ".zip"))]


def find_sdist(name: str, version: str, *, what: str) -> tuple[str, str, str | None] | None:
    """(file name, URL, listed sha256) of ``name`` ``version``'s sdist on pip's index, or None."""
    for filename, url, listed in sdist_files(name, what=what):
        try:
            _, ver = parse_sdist_filename(filename)
        except ValueError:
            continue
        if str(ver) == version:
            return filename, url, listed
    return None


def _sdist_url(name: str, version: str, sha256: str, *, what: str) -> tuple[str, str]:
    found = find_sdist(name, version, what=what)
    if found is None:
        raise UserError(
            f"packages.{what}.source: no sdist of {name} {version} on {pip_index_url()}; "
            "check name and version"
        )
    filename, url, listed = found
    if listed and listed != sha256:
        raise UserError(
            f"packages.{what}.source.sha256: the index lists {filename} with sha256 {listed}, "
            f"the config says {sha256}; check which one is right"
        )
    return url, filename


def fetch_archive(cache: Path, url: str, filename: str, sha256: str, *, what: str) -> Path:
    """The archive at ``url`` in the cache (``<cache>/archives/<sha256>/``), checked against ``sha256``."""
    return _fetch_archive(cache, url, filename, sha256, offline=False, bundle=None, what=what)


def _http_get(url: str, *, what: str, accept: str = "*/*") -> tuple[bytes, str]:
    def get() -> tuple[bytes, str]:
        with _open(url, accept) as resp:
            return resp.read(), resp.headers.get("Content-Type", "")

    return _with_retries(get, url=url, what=what)


def _open(url: str, accept: str = "*/*"):
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "rocmforge"})
    return urllib.request.urlopen(request, timeout=60)


def _with_retries(action, *, url: str, what: str):
    """``action()`` talks HTTP to ``url``: retry failed or cut connections and 5xx answers with backoff."""
    for delay in (*RETRY_DELAYS, None):
        try:
            return action()
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise UserError(f"{what}: {url}: HTTP {exc.code} {exc.reason}; check the url") from None
            error = f"HTTP {exc.code} {exc.reason}"
            final = f"{what}: {url}: {error} after {len(RETRY_DELAYS) + 1} attempts; try again later"
        except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
            error = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            if _UNRESOLVED_RE.search(error):
                host = urllib.parse.urlsplit(url).hostname
                raise UserError(f"{what}: cannot resolve {host} ({error}); {_OFFLINE_FIX}") from None
            final = (
                f"{what}: network error after {len(RETRY_DELAYS) + 1} attempts at {url}: {error}; "
                f"{_OFFLINE_FIX}"
            )
        if delay is None:
            raise UserError(final) from None
        console.print(f"{what}: {url}: {error}; retrying in {delay:g} s")
        time.sleep(delay)
    raise AssertionError("unreachable")


def archive_path(cache: Path, sha256: str, filename: str) -> Path:
    """Where an archive with this hash lives in the cache."""
    return cache / "archives" / sha256 / filename


def _fetch_archive(cache, url, filename, sha256, *, offline, bundle, what) -> Path:
    """The verified archive in the cache; downloaded (or taken from an export) when missing."""
    if filename is None:
        places = [cache / "archives" / sha256, *([bundle / "archives" / sha256] if bundle else [])]
        found = [p.name for d in places if d.is_dir() for p in d.iterdir() if not p.name.startswith(".")]
        filename = found[0] if found else "archive"
    dest = archive_path(cache, sha256, filename)
    with file_lock(
        dest.parent.with_suffix(".lock"), what=f"fetching {filename}", on_wait=_waiting(str(dest))
    ):
        if dest.is_file():
            if file_sha256(dest) == sha256:
                return dest
            console.print(f"{what}: cached {dest} is corrupt (sha256 differs); deleting it")
            dest.unlink()
        exported = bundle / "archives" / sha256 / filename if bundle else None
        if exported is not None and exported.is_file():
            url = exported.as_uri()
        elif offline:
            where = f"the export {bundle}" if bundle else f"the cache ({dest.parent})"
            raise UserError(
                f"{what}: offline, and its archive (sha256 {sha256}) is not in {where}; "
                "run once with network (or make a new export with `nox -s export`)"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".part", dir=dest.parent)
        try:
            os.close(fd)
            console.print(f"{what}: downloading {url}")

            def download() -> str:
                h, received = hashlib.sha256(), 0
                with _open(url) as resp, open(tmp, "wb") as out:  # "wb": a retry starts over
                    for chunk in iter(lambda: resp.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
                        received += len(chunk)
                    expected = int(resp.headers.get("Content-Length") or received)
                # A connection closed early looks like the end of the file to read(n): check it.
                if received < expected:
                    raise http.client.IncompleteRead(b"", expected - received)
                return h.hexdigest()

            digest = _with_retries(download, url=url, what=what)
            if digest != sha256:
                raise UserError(
                    f"{what}: {url} has sha256 {digest}, expected {sha256}; the download was deleted "
                    f"(fix packages.{what}.source.sha256 if the archive changed on purpose)"
                )
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            with contextlib.suppress(OSError):
                dest.parent.rmdir()  # leave the cache as it was: no empty entry either
            raise
        return dest


def _import_archive(archive: Path, staging: Path, *, what: str) -> str:
    """Extract ``archive`` into ``staging`` (single top directory stripped) and commit it.

    The commit gives archives what git trees have: patches apply with git, a reset makes the
    tree clean again, and ``git diff`` shows a user's edits.
    """
    raw = staging / ".extract"
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(raw)
        else:
            with tarfile.open(archive) as tf:
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(raw, filter="data")
                else:  # pragma: no cover - Python without extraction filters
                    tf.extractall(raw)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise UserError(
            f"{what}: {archive.name} is not a readable archive ({exc}); check the url and sha256"
        ) from None
    entries = list(raw.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else raw
    for item in top.iterdir():
        os.replace(item, staging / item.name)
    shutil.rmtree(raw)
    return _commit_tree(staging, archive.name)


def _commit_tree(staging: Path, what: str) -> str:
    """Commit everything in ``staging`` as one new repository; the commit id."""
    git.run(["init", "-q"], cwd=staging)
    git.run(["add", "--all", "--force", "."], cwd=staging)
    git.run(["commit", "-q", "--no-verify", "-m", f"rocmforge: {what}"], cwd=staging)
    return git.run(["rev-parse", "HEAD"], cwd=staging).stdout.strip()


# In-tree outputs of an earlier `pip wheel .` run inside the ROCm install (the vLLM
# Dockerfile's build_amdsmi does that as root): not part of the source.
_BUILD_LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__")


def _import_directory(source: Path, staging: Path) -> str:
    """Copy a tree of the ROCm install into ``staging`` and commit it: builds never write there."""
    shutil.copytree(source, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*_BUILD_LEFTOVERS))
    return _commit_tree(staging, str(source))


def tree_sha256(root: Path) -> str:
    """A digest of a directory's files (paths and contents), build leftovers excluded."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(fnmatch.fnmatch(part, p) for part in rel.parts for p in _BUILD_LEFTOVERS):
            continue
        if path.is_file():
            files.append([rel.as_posix(), file_sha256(path)])
    return json_sha256(files)


def rocm_tree(pkg: Package, installs) -> Path:
    """Where ``pkg``'s ``kind = "rocm"`` source lives in the ROCm a build uses (the first of
    ``installs``), or a one-line error with the fix."""
    rel = pkg.source.rocm_path
    if not installs:
        raise UserError(
            f"packages.{pkg.name}.source: a rocm source needs a ROCm install, and none was found; "
            f"install ROCm or set ROCM_PATH, or take {pkg.name} prebuilt ([packages.{pkg.name}.prebuilt])"
        )
    root = Path(installs[0].root)
    where = root / rel
    if not (where / "pyproject.toml").is_file() and not (where / "setup.py").is_file():
        what = "has no pyproject.toml or setup.py" if where.is_dir() else "does not exist"
        raise UserError(
            f"packages.{pkg.name}.source: {where} {what} (ROCm {installs[0].version or '?'} at {root}); "
            f"install the ROCm component that ships it (amd-smi-lib for share/amd_smi), or take "
            f"{pkg.name} prebuilt ([packages.{pkg.name}.prebuilt], see docs/stack.md)"
        )
    return where


def _reusable_import(stamp_path: Path, tree: Path, sha256: str) -> str | None:
    """The import commit of ``tree`` when it already holds this archive (only patches change)."""
    stamp = read_json(stamp_path)
    if not stamp or stamp["key"].get("sha256") != sha256 or not git.is_work_tree(tree):
        return None
    base = stamp.get("base")
    return base if base and git.resolve(base, git_dir=tree / ".git") else None


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
