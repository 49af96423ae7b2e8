"""Git mirrors in the per-user cache: one bare mirror per URL, commits fetched shallowly by sha.

``<cache>/git/<slug>.git`` holds the objects, ``<slug>.pins.json`` which (rev, commit) pairs were
verified against the server. Submodules get mirrors of their own; a checkout's work tree borrows
the objects (``objects/info/alternates``). Offline, commits come from the mirror or from an export
(``ROCMFORGE_OFFLINE_BUNDLE``: git bundles, and the wheels for the build venvs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rocmforge.config import Config
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, read_json
from rocmforge.sources import cache, git
from rocmforge.sources.cache import OFFLINE_FIX, UNRESOLVED_RE, replace_tree, waiting

if TYPE_CHECKING:
    from rocmforge.sources.checkout import Checkout

BUNDLE_ENV = "ROCMFORGE_OFFLINE_BUNDLE"
BUNDLE_WHEELS = "wheels"  # the export's wheels for the build venvs (sources/export.py writes them)
HEX_RE = re.compile(r"^[0-9a-f]{7,40}$")
# git's messages for a connection that failed or broke: worth a retry, unlike a refused request.
_TRANSIENT_RE = re.compile(
    r"unable to connect|connection (refused|reset|timed out|closed)|could not resolve host|early eof"
    r"|hung up unexpectedly|rpc failed|timed out|temporary failure|network is unreachable"
    r"|could not read from remote repository|unexpected disconnect|broken pipe|invalid packet",
    re.IGNORECASE,
)


def _remote(args: list[str], *, git_dir: Path, what: str):
    """Run a git command that talks to a server, retrying connection failures with backoff.

    Returns the last completed process; raises when every attempt failed for network reasons.
    """
    for delay in (*cache.RETRY_DELAYS, None):
        proc = git.run(args, git_dir=git_dir, check=False)
        if proc.returncode != 0 and UNRESOLVED_RE.search(proc.stderr):
            raise UserError(f"{what}: {git.last_line(proc.stderr)}; {OFFLINE_FIX}")
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
                f"{what}: network error after {len(cache.RETRY_DELAYS) + 1} attempts: "
                f"{git.last_line(proc.stderr)}; {OFFLINE_FIX}"
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


def walk(repo: _Repo) -> Iterator[_Repo]:
    yield repo
    for child in repo.children:
        yield from walk(child)


def git_dirs(root: _Repo) -> dict[str, tuple[Path, str]]:
    return {r.path: (r.mirror, r.commit) for r in walk(root)}


def resolve_repo(cache, url, rev, pin, path, submodules, offline, bundle, what) -> _Repo:
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
                        resolve_repo,
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
    with file_lock(lock, what=f"fetching {url}", on_wait=waiting(str(mirror))):
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
    if HEX_RE.match(rev):
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


def materialize(tree: Path, root: _Repo) -> None:
    """Check every repository of ``root`` out under ``tree``; a new tree is built aside and renamed."""
    if git.is_work_tree(tree):
        _checkout_all(tree, root)
        return
    staging = Path(tempfile.mkdtemp(prefix=f".{tree.name}.tmp-", dir=tree.parent))
    try:
        _checkout_all(staging, root)
        replace_tree(staging, tree)
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
    reset_tree(where, commit)


def reset_tree(where: Path, commit: str) -> None:
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


def bundle_dir() -> Path | None:
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
