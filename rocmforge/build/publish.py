"""Publish a nightly's wheels as static indexes: one per GPU arch set, switched atomically.

The nightly workflow uploads one artifact per matrix cell, ``wheelhouse-<arch-set>--py<X.Y>``.
``publish`` merges the cells of each arch set (the Python versions) into one wheelhouse and
lays it out under a site root that any web server serves as plain files::

    <site>/<arch-set>/<release>/*.whl, simple/, constraints.txt
    <site>/<arch-set>/latest -> <release>        a symlink, replaced in one rename

so a reader never sees a half-copied index, and yesterday's release stays for a rollback.
Arch sets get separate indexes because their wheels share file names (same version, other
code objects inside).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from packaging.version import Version

from rocmforge.build.provenance import statement_path
from rocmforge.build.wheelhouse import Entry, Wheelhouse
from rocmforge.console import console
from rocmforge.errors import UserError

ARTIFACT_RE = re.compile(r"^wheelhouse-(?P<archs>[A-Za-z0-9_.-]+?)--py(?P<python>[0-9]+\.[0-9]+)$")
_RELEASE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def publish(artifacts: Path, site: Path, release: str) -> dict[str, list[Entry]]:
    """Publish every ``wheelhouse-<arch-set>--py<X.Y>`` directory under ``artifacts``.

    Returns the published entries per arch set. A wheel name built by several Python cells
    (an abi3 or pure-Python wheel) is taken from the oldest Python, which every newer one can
    load; the bytes differ between cells because each records the Python it was built with.
    Each wheel's provenance statement (``<wheel>.intoto.json``) is published beside it.
    """
    if not _RELEASE_RE.match(release) or release == "latest":
        raise UserError(f"--release: {release!r} must be letters, digits, '.', '_' or '-' (not 'latest')")
    groups: dict[str, list[tuple[Version, Path]]] = {}
    for path in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
        match = ARTIFACT_RE.match(path.name)
        if path.is_dir() and match:
            groups.setdefault(match["archs"], []).append((Version(match["python"]), path))
    if not groups:
        raise UserError(f"{artifacts}: no wheelhouse-<arch-set>--py<X.Y> directories to publish")
    return {archs: _publish_set(sorted(cells), site / archs, release) for archs, cells in groups.items()}


def _publish_set(cells: list[tuple[Version, Path]], root: Path, release: str) -> list[Entry]:
    dest = root / release
    if dest.exists():
        raise UserError(f"{dest}: release {release!r} is already published; pick another --release")
    staging = root / f".{release}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for _python, cell in cells:
        wheels = sorted(cell.glob("*.whl"))
        if not wheels:
            raise UserError(f"{cell}: no wheels; the build of this matrix cell produced nothing")
        for wheel in wheels:
            if not (staging / wheel.name).exists():
                shutil.copyfile(wheel, staging / wheel.name)
                if statement_path(wheel).is_file():
                    shutil.copyfile(statement_path(wheel), statement_path(staging / wheel.name))
    entries = Wheelhouse(staging).reindex()
    os.replace(staging, dest)
    link = root / ".latest.partial"
    link.unlink(missing_ok=True)
    link.symlink_to(release)
    os.replace(link, root / "latest")
    console.print(f"published {len(entries)} wheels to {dest} (now {root / 'latest'})")
    return entries


def add_arguments(parser) -> None:
    """``python -m rocmforge publish ARTIFACTS SITE --release ID``."""
    parser.add_argument("artifacts", type=Path, help="directory of wheelhouse-<arch-set>--py<X.Y> dirs")
    parser.add_argument("site", type=Path, help="site root the index server serves")
    parser.add_argument("--release", required=True, help="name of this release, e.g. the CI run id")


def main(args) -> int:
    """Publish the artifacts of a nightly run."""
    publish(args.artifacts, args.site, args.release)
    return 0
