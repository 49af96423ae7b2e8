"""Archives in the per-user cache: sdists from a PyPI index, URLs, ROCm trees, local directories.

``<cache>/archives/<sha256>/<file>`` stores each download under its hash, checked before use; an
archive is imported as a one-commit git tree so that patches and the stamp work as for git.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename

from rocmforge.config import Package, Source
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import file_lock, file_sha256, json_sha256, read_json
from rocmforge.sources import cache, git
from rocmforge.sources.cache import OFFLINE_FIX, UNRESOLVED_RE, waiting


def archive_location(pkg: Package, src: Source, *, offline: bool) -> tuple[str | None, str | None]:
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
    return cached_archive(cache, url, filename, sha256, offline=False, bundle=None, what=what)


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
    for delay in (*cache.RETRY_DELAYS, None):
        try:
            return action()
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise UserError(f"{what}: {url}: HTTP {exc.code} {exc.reason}; check the url") from None
            error = f"HTTP {exc.code} {exc.reason}"
            final = f"{what}: {url}: {error} after {len(cache.RETRY_DELAYS) + 1} attempts; try again later"
        except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
            error = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            if UNRESOLVED_RE.search(error):
                host = urllib.parse.urlsplit(url).hostname
                raise UserError(f"{what}: cannot resolve {host} ({error}); {OFFLINE_FIX}") from None
            final = (
                f"{what}: network error after {len(cache.RETRY_DELAYS) + 1} attempts at {url}: {error}; "
                f"{OFFLINE_FIX}"
            )
        if delay is None:
            raise UserError(final) from None
        console.print(f"{what}: {url}: {error}; retrying in {delay:g} s")
        time.sleep(delay)
    raise AssertionError("unreachable")


def archive_path(cache: Path, sha256: str, filename: str) -> Path:
    """Where an archive with this hash lives in the cache."""
    return cache / "archives" / sha256 / filename


def cached_archive(cache, url, filename, sha256, *, offline, bundle, what) -> Path:
    """The verified archive in the cache; downloaded (or taken from an export) when missing."""
    if filename is None:
        places = [cache / "archives" / sha256, *([bundle / "archives" / sha256] if bundle else [])]
        found = [p.name for d in places if d.is_dir() for p in d.iterdir() if not p.name.startswith(".")]
        filename = found[0] if found else "archive"
    dest = archive_path(cache, sha256, filename)
    with file_lock(dest.parent.with_suffix(".lock"), what=f"fetching {filename}", on_wait=waiting(str(dest))):
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


def import_archive(archive: Path, staging: Path, *, what: str) -> str:
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


def import_directory(source: Path, staging: Path) -> str:
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


def reusable_import(stamp_path: Path, tree: Path, sha256: str) -> str | None:
    """The import commit of ``tree`` when it already holds this archive (only patches change)."""
    stamp = read_json(stamp_path)
    if not stamp or stamp["key"].get("sha256") != sha256 or not git.is_work_tree(tree):
        return None
    base = stamp.get("base")
    return base if base and git.resolve(base, git_dir=tree / ".git") else None
