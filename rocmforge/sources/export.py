"""Air-gapped builds: everything a build needs, exported into one directory (or tarball).

``nox -s export -- DEST [--tar]`` writes::

    DEST/rocmforge.lock.toml        the lock the export was made from
    DEST/build_config.toml          the config, and patches/<pkg>/ with every patch file
    DEST/git/<mirror>.bundle        git bundle of the pinned commits of each repository and
    DEST/git/<mirror>.shallow         submodule (.shallow: where shallow history ends;
    DEST/git/<mirror>.pins.json       .pins.json: the rev -> commit checks already made)
    DEST/archives/<sha256>/<file>   sdists and archives, as in the cache
    DEST/wheels/                    wheels of everything the build venvs install from an index:
                                      each recipe's build requirements (the list the build itself
                                      asks for, :func:`rocmforge.build.package.venv_requirements`) and what
                                      they depend on, resolved by uv for the build's Python

On the air-gapped machine, ``ROCMFORGE_OFFLINE_BUNDLE=DEST`` makes every checkout read from
the export and every build venv install from ``DEST/wheels`` only (``--no-index``), never
touching the network. See docs/sources.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rocmforge.build import install, recipes
from rocmforge.build import package as build
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.config import Config
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.sources import checkout as sources
from rocmforge.sources import git, lock, mirrors

# Distribution names of our packages whose wheel is named otherwise than the package.
_DIST_NAMES = {"pytorch": "torch"}


def export(cfg: Config, dest: Path, *, tar: bool = False, index_args: tuple[str, ...] = ()) -> Path:
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
        sources.write_lock(cfg)
        checkouts = sources.prepare_all(cfg)
        shutil.copy2(lock.lock_path(cfg), staging / lock.LOCK_FILE)
        shutil.copy2(cfg.path, staging / cfg.path.name)
        for checkout in checkouts:
            _export_source(cfg, checkout, staging)
            _download_wheels(cfg, checkout, staging / mirrors.BUNDLE_WHEELS, index_args)
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
        for url, commit in mirrors.git_repositories(cfg, checkout):
            by_mirror.setdefault(mirrors.mirror_path(cache, url), []).append(commit)
        for mirror, commits in by_mirror.items():
            refs = []
            for commit in commits:
                git.run(["update-ref", f"refs/rocmforge/{commit}", commit], git_dir=mirror)
                refs.append(f"refs/rocmforge/{commit}")
            out = staging / "git" / mirrors.bundle_name(mirror)
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


def venv_requirements(cfg: Config, checkout: sources.Checkout) -> tuple[list[str], dict[str, Path]]:
    """What the build venv of ``checkout``'s package installs: the requirements it takes from an
    index, asked of its recipe with the context the build will use
    (:func:`rocmforge.build.package.build_context`), and its dependencies' wheels."""
    pkg = cfg.package(checkout.package)
    deps = _dependency_wheels(cfg, pkg.name)
    ctx = build.build_context(cfg, pkg.name, checkout, deps)
    return build.venv_requirements(recipes.get(pkg.recipe), ctx), deps


def _dependency_wheels(cfg: Config, name: str) -> dict[str, Path]:
    """The wheelhouse's dependency wheels, as the build will see them; before they are built,
    the names they will have (all the recipes and the requirement filter look at)."""
    try:
        return build.dependency_wheels(cfg, name)
    except UserError:
        depends = list(cfg.package(name).depends)
        return {dep: Path(f"{_dist_name(cfg, dep)}-0-py3-none-any.whl") for dep in cfg.build_order(depends)}


def _dist_name(cfg: Config, name: str) -> str:
    """The distribution name of our package ``name``'s wheel, spelled as in a wheel's file name."""
    prebuilt = cfg.package(name).prebuilt
    dist = Requirement(prebuilt.requirement).name if prebuilt is not None else _DIST_NAMES.get(name, name)
    return canonicalize_name(dist).replace("-", "_")


def _download_wheels(
    cfg: Config, checkout: sources.Checkout, wheels: Path, index_args: tuple[str, ...]
) -> None:
    """Wheels of everything the package's build venv installs from an index, for the build's Python.

    uv resolves the venv as the build does (the requirements, plus the runtime requirements of
    the dependency wheels it installs), so the offline venv gets the versions the online one
    would; pip then downloads exactly those pins (uv has no download command). One resolution
    per package: two venvs may pin one project differently.
    """
    name = checkout.package
    wheels.mkdir(parents=True, exist_ok=True)
    requirements, deps = venv_requirements(cfg, checkout)
    built = [wheel for wheel in deps.values() if wheel.is_file()]
    if missing := [dep for dep, wheel in deps.items() if not wheel.is_file()]:
        console.print(
            f"{name}: not built yet: {', '.join(missing)}; the export lacks the runtime requirements "
            f"of those wheels, which {name}'s build venv installs (build them first for a complete export)"
        )
    if not requirements and not built:
        return
    version = ".".join(build.python_version(cfg).split(".")[:2])
    console.print(f"{name}: resolving the build venv for Python {version}: {', '.join(requirements)}")
    resolve = [install.uv_binary(), "pip", "compile", "-q", "--no-header", "--no-annotate"]
    resolve += ["--python-version", version, *index_args]
    house = Wheelhouse(cfg.build.wheelhouse)
    if built:  # as the build venv: our index first, so our projects never come from PyPI
        resolve += ["--index", house.simple.resolve().as_uri()]
    paths = [str(wheel) for wheel in built]
    proc = subprocess.run(
        [*resolve, "-"], input="\n".join(requirements + paths), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise UserError(f"{name}: resolving the build requirements failed: {git.last_line(proc.stderr)}")
    ours = {e.project for e in house.entries()}
    pins = [
        line
        for line in proc.stdout.splitlines()
        if line
        and not line.startswith(("#", "-"))
        and line not in paths
        and canonicalize_name(Requirement(line).name) not in ours
    ]
    if not pins:
        return
    # Wheels only: an sdist would have to be built on the air-gapped machine, needing its own
    # build requirements there.
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", version, "--dest", str(wheels), *index_args, *pins]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(
            f"{name}: pip download of the build requirements failed: {git.last_line(proc.stderr)}"
        )


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
