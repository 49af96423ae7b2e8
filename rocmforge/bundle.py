"""Air-gapped builds: everything a build needs, exported into one directory (or tarball).

``nox -s export -- DEST [--tar]`` writes::

    DEST/rocmforge.lock.toml        the lock the export was made from
    DEST/build_config.toml          the config, and patches/<pkg>/ with every patch file
    DEST/git/<mirror>.bundle        git bundle of the pinned commits of each repository and
    DEST/git/<mirror>.shallow         submodule (.shallow: where shallow history ends;
    DEST/git/<mirror>.pins.json       .pins.json: the rev -> commit checks already made)
    DEST/archives/<sha256>/<file>   sdists and archives, as in the cache
    DEST/wheels/                    wheels of the build requirements (``pip download``)

On the air-gapped machine, ``ROCMFORGE_OFFLINE_BUNDLE=DEST`` makes every checkout read from
the export and never touch the network; ``PIP_NO_INDEX=1 PIP_FIND_LINKS=DEST/wheels`` does the
same for pip. See docs/sources.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from rocmforge import git, lock, sources
from rocmforge.config import Config
from rocmforge.console import console
from rocmforge.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# Distribution names of the packages we build ourselves: never downloaded as build requirements.
_DIST_NAMES = {"pytorch": "torch"}


def export(cfg: Config, dest: Path, *, tar: bool = False, pip_args: tuple[str, ...] = ()) -> Path:
    """Write the export to ``dest`` (built aside, renamed when complete); returns the path written."""
    dest = dest.resolve()
    if dest.exists():
        raise UserError(f"{dest} already exists; choose a new directory for the export")
    # The staging directory first: an unwritable DEST was a traceback after the lock and every checkout.
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as exc:
        raise UserError(
            f"{dest}: cannot create the export there ({exc.strerror or exc}); choose a writable directory"
        ) from None
    try:
        lock.write_lock(cfg)
        checkouts = [sources.prepare(cfg, n) for n in cfg.build_order() if cfg.package(n).source is not None]
        shutil.copy2(lock.lock_path(cfg), staging / lock.LOCK_FILE)
        shutil.copy2(cfg.path, staging / cfg.path.name)
        requirements: list[str] = []
        for checkout in checkouts:
            _export_source(cfg, checkout, staging)
            requirements += build_requirements(cfg, checkout)
        _download_wheels(sorted(set(requirements)), staging / "wheels", pip_args)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    console.print(f"exported {len(checkouts)} packages to {dest}")
    if not tar:
        return dest
    archive = dest.with_name(dest.name + ".tar")
    with tarfile.open(archive, "w") as tf:
        tf.add(dest, arcname=dest.name)
    console.print(f"wrote {archive}")
    return archive


def _export_source(cfg: Config, checkout: sources.Checkout, staging: Path) -> None:
    cache = cfg.build.cache_dir
    if checkout.kind == "git":
        by_mirror: dict[Path, list[str]] = {}
        for url, commit in sources.git_repositories(cfg, checkout):
            by_mirror.setdefault(sources.mirror_path(cache, url), []).append(commit)
        for mirror, commits in by_mirror.items():
            refs = []
            for commit in commits:
                git.run(["update-ref", f"refs/rocmforge/{commit}", commit], git_dir=mirror)
                refs.append(f"refs/rocmforge/{commit}")
            out = staging / "git" / sources.bundle_name(mirror)
            out.parent.mkdir(parents=True, exist_ok=True)
            git.run(["bundle", "create", "-q", str(out), *refs], git_dir=mirror)
            if (mirror / "shallow").exists():
                shutil.copy2(mirror / "shallow", out.with_suffix(".shallow"))
            pins = mirror.with_suffix(".pins.json")
            if pins.exists():
                shutil.copy2(pins, out.with_suffix(".pins.json"))
    elif checkout.kind in ("pypi", "url"):
        found = list((cache / "archives" / checkout.sha256).iterdir())
        target = staging / "archives" / checkout.sha256
        target.mkdir(parents=True, exist_ok=True)
        for f in found:
            if not f.name.startswith("."):
                shutil.copy2(f, target / f.name)
    for file, _sha in checkout.patches:
        src = cfg.root / "patches" / checkout.package / file
        (staging / "patches" / checkout.package).mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, staging / "patches" / checkout.package / file)


def build_requirements(cfg: Config, checkout: sources.Checkout) -> list[str]:
    """``[build-system].requires`` of the checkout, without the packages we build ourselves."""
    pyproject = checkout.project_dir / "pyproject.toml"
    if not pyproject.is_file():
        return []
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    ours = {canonicalize_name(_DIST_NAMES.get(n, n)) for n in cfg.packages}
    requires = tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires", [])
    kept = []
    for text in requires:
        try:
            if canonicalize_name(Requirement(text).name) in ours:
                continue
        except InvalidRequirement:
            raise UserError(f"{pyproject}: build requirement {text!r} is not valid") from None
        kept.append(text)
    return kept


def _download_wheels(requirements: list[str], wheels: Path, pip_args: tuple[str, ...]) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    if not requirements:
        return
    console.print(f"downloading build requirements: {', '.join(requirements)}")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--prefer-binary", "--dest", str(wheels)]
    proc = subprocess.run([*cmd, *pip_args, *requirements], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"pip download of the build requirements failed: {git.last_line(proc.stderr)}")


def export_session(session, cfg: Config) -> None:
    """``nox -s export -- DEST [--tar]``."""
    args = list(session.posargs)
    tar = "--tar" in args
    rest = [a for a in args if a != "--tar"]
    if len(rest) != 1:
        session.error("usage: nox -s export -- DEST [--tar]")
    path = export(cfg, Path(rest[0]), tar=tar)
    where = path.with_suffix("") if tar else path
    session.log(
        f"on the offline machine: ROCMFORGE_OFFLINE_BUNDLE={where} (unpacked there; see docs/sources.md)"
    )
