"""Installing the wheelhouse so that nothing else can take its wheels' place.

Two things make an install from the wheelhouse exact:

- ``requirements.txt``, written with the index (:func:`requirements_file`): the stack and every
  third-party package it needs at run time, each ``==`` pinned with its sha256, resolved by uv
  for the wheels' Python with this wheelhouse's index first. Installed with hashes required,
  nothing else can come in: not a newer release, not another file of the same version.
- the commands (:func:`install_argv`): every source of packages is given on the command line and
  the installer's own configuration is switched off (``uv --no-config``, ``pip --isolated``), so
  a ``UV_FIND_LINKS``, an ``unsafe-best-match`` strategy, a ``uv.toml`` or ``pip.conf`` left in
  place cannot add an index that serves a higher version of one of our projects.

``tests/test_install.py`` installs with both commands under twelve such settings, with an
attacker's index on 127.0.0.1 and a find-links directory holding higher versions.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from rocmforge.build.wheelfile import read_metadata

if TYPE_CHECKING:
    from rocmforge.build.wheelhouse import Entry

PYPI = "https://pypi.org/simple"
REQUIREMENTS = "requirements.txt"
# Settings of uv and pip that add, replace or reorder package sources, or relax hash checking.
# The lock is resolved without them: a leftover index must not get into requirements.txt.
_SOURCE_SETTING = re.compile(
    r"(UV|PIP)_(INDEX\w*|EXTRA_INDEX_URL|DEFAULT_INDEX|FIND_LINKS|NO_INDEX|INDEX_STRATEGY|CONFIG_FILE"
    r"|TRUSTED_HOST|CONSTRAINT|OVERRIDE|NO_BUILD_ISOLATION|PRERELEASE|PRE|REQUIRE_HASHES|NO_CONFIG)"
)


def uv_binary() -> str:
    """The uv executable: on PATH, else the one the ``uv`` package ships."""
    found = shutil.which("uv")
    if found:
        return found
    from uv import find_uv_bin

    return find_uv_bin()


def public_index(environ: Mapping[str, str] | None = None) -> str:
    """The index for everything the wheelhouse does not hold: the one the user set (uv's or
    pip's variable), else PyPI."""
    environ = os.environ if environ is None else environ
    for key in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if environ.get(key):
            return environ[key]
    return PYPI


def target_python(entries: Sequence[Entry]) -> str:
    """``X.Y`` of the Python the wheels are for (their ``cpXY`` tag), else this interpreter's."""
    for e in entries:
        for tag in parse_wheel_filename(e.path.name)[3]:
            m = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
            if m:
                return f"{m[1]}.{m[2]}"
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def clean_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` without the uv and pip settings that change where packages come from."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if not _SOURCE_SETTING.fullmatch(k)}


def offline_wheels(environ: Mapping[str, str] | None = None) -> Path | None:
    """The offline export's ``wheels/`` when building from one (``ROCMFORGE_OFFLINE_BUNDLE``)."""
    from rocmforge.sources.mirrors import (  # the export's layout (sources: heavy, lazily)
        BUNDLE_ENV,
        BUNDLE_WHEELS,
    )

    environ = os.environ if environ is None else environ
    export = environ.get(BUNDLE_ENV)
    return Path(export).expanduser() / BUNDLE_WHEELS if export else None


def uv_sources(simple: Path, index: str, *, offline: bool = False) -> list[str]:
    """uv arguments: this wheelhouse's index first (nothing it holds comes from elsewhere), then
    ``index``; uv's configuration files off, every source-related option given here.

    ``offline``: no network (uv's ``--offline``: local files and uv's cache only), and the
    offline export's wheels (:func:`offline_wheels`) as a find-links directory when there is one.
    """
    # --extra-index-url too: given on the command line it replaces UV_EXTRA_INDEX_URL, whose
    # index would otherwise rank above the default one (and, first-index, answer for it).
    argv = [
        "--no-config",
        "--index-strategy",
        "first-index",
        "--index",
        # Not resolved: simple/ is a symlink into the current generation, which a publish replaces.
        Path(os.path.abspath(simple)).as_uri(),
        "--extra-index-url",
        index,
        "--default-index",
        index,
    ]
    if offline:
        wheels = offline_wheels()
        argv += ["--offline", *(["--find-links", str(wheels)] if wheels else [])]
    return argv


@dataclass(frozen=True)
class Requirements:
    """``requirements.txt`` as resolved: its text, and the third-party requirements it lacks
    (``"filelock (torch)"``: what could not be resolved, and which of our wheels needs it)."""

    text: str
    missing: tuple[str, ...] = ()
    reason: str = ""  # uv's last line on the first failure, when anything is missing


def requirements_file(entries: Sequence[Entry], simple: Path, *, index: str | None = None) -> Requirements:
    """``requirements.txt`` for ``entries``, whose index is ``simple``.

    ``uv pip compile --generate-hashes`` of ``project==version`` for every wheel, for the wheels'
    Python, against ``simple`` first and ``index`` (default :func:`public_index`) for the rest.
    Air-gapped clusters are common, so the network is never required: when that fails (or an
    offline export is configured, :func:`offline_wheels`), the same is resolved offline, from
    local files and uv's cache; when even that fails, the file lists our wheels (their published
    sha256) and every third-party requirement that resolves offline, and names the rest.
    """
    index = index or public_index()
    python = target_python(entries)
    pins = [f"{e.project}=={e.version}" for e in entries]
    attempts = [True] if offline_wheels() else [False, True]
    failure = ""
    for offline in attempts:
        proc = _compile(pins, simple, index, python, offline=offline)
        if proc.returncode == 0:
            rest = _OFFLINE if offline else index
            return Requirements(_header(python, rest) + proc.stdout)
        failure = failure or (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    # What can be had offline: each third-party requirement alone, then those together.
    ours = {canonicalize_name(e.project) for e in entries}
    needed = _third_party(entries, ours)
    missing = [r for r in needed if _compile([r], simple, index, python, offline=True).returncode != 0]
    found = [r for r in needed if r not in missing]
    blocks = {
        canonicalize_name(e.project): f"{e.project}=={e.version} \\\n    --hash=sha256:{e.sha256}\n"
        for e in entries
    }
    proc = _compile(found, simple, index, python, offline=True) if found else None
    if proc is not None and proc.returncode != 0:  # each alone resolves, together they conflict
        missing, found = needed, []
    elif proc is not None:
        for block in re.split(r"\n(?=\S)", proc.stdout.strip()):
            name = canonicalize_name(re.split(r"[=<>!~; \\]", block, maxsplit=1)[0])
            if block and name not in ours:  # ours as published, never as another index has them
                blocks[name] = block + "\n"
    named = tuple(f"{Requirement(r).name} ({', '.join(needed[r])})" for r in missing)
    header = _header(python, _OFFLINE)
    if named:
        header += f"# INCOMPLETE: not resolvable here, install from your own mirror: {', '.join(named)}\n"
    return Requirements(header + "".join(blocks[n] for n in sorted(blocks)), named, failure)


def _compile(requirements: Sequence[str], simple: Path, index: str, python: str, *, offline: bool):
    """``uv pip compile --generate-hashes`` of ``requirements``; the finished process."""
    argv = [uv_binary(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--generate-hashes"]
    argv += ["--python-version", python, *uv_sources(simple, index, offline=offline), "-"]
    text = "".join(f"{r}\n" for r in requirements)
    return subprocess.run(argv, input=text, capture_output=True, text=True, env=clean_environ())


_OFFLINE = "local files and uv's cache (offline)"


def _header(python: str, rest: str) -> str:
    return (
        "# The wheels of this wheelhouse and everything they need at run time, exact and hash-pinned,\n"
        f"# resolved for Python {python} with this index first and {rest} for the rest.\n"
        "# Install: see `nox -s index` (uv pip sync / pip install --require-hashes).\n"
    )


def resolved_offline(root: Path) -> bool:
    """Whether ``root/requirements.txt`` was resolved without the network: then it is installed so."""
    try:
        head = (Path(root) / REQUIREMENTS).read_text().split("\n", 2)[:2]
    except OSError:
        return False
    return any(_OFFLINE in line for line in head)


def _third_party(entries: Sequence[Entry], ours: set[str]) -> dict[str, list[str]]:
    """Requirements of ``entries`` on other projects (extras left out) -> the projects needing each."""
    needed: dict[str, list[str]] = {}
    for e in entries:
        try:
            metadata = read_metadata(e.path)
        except (OSError, ValueError, zipfile.BadZipFile):  # no wheel to read: it needs nothing we can say
            continue
        for line in metadata.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if canonicalize_name(req.name) not in ours and "extra" not in str(req.marker or ""):
                needed.setdefault(line, []).append(e.project)
    return needed


def install_argv(
    tool: str, root: Path, *, index: str | None = None, python: str | None = None, offline: bool = False
) -> list[str]:
    """The command that makes an environment exactly ``root/requirements.txt``.

    ``uv``: ``uv pip sync`` (anything else in the environment goes), hashes required, sources as
    :func:`uv_sources`. ``pip``: ``pip install --isolated`` (no environment variables, no user
    pip.conf), hashes required, this index first, ``index`` for the rest. ``python``: the
    environment's interpreter (uv ``--python``; pip runs as ``python -m pip``). ``offline``: no
    network, the offline export's wheels too (as :func:`uv_sources`).
    """
    root = Path(os.path.abspath(root))
    index = index or public_index()
    requirements = str(root / REQUIREMENTS)
    simple = root / "simple"
    if tool == "uv":
        target = ["--python", python] if python else []
        return [
            uv_binary(),
            "pip",
            "sync",
            *target,
            *uv_sources(simple, index, offline=offline),
            "--require-hashes",
            requirements,
        ]
    pip = [python, "-m", "pip"] if python else ["pip"]
    wheels = offline_wheels() if offline else None
    # Offline, pip would retry an unreachable index for minutes: the export's wheels instead.
    rest = ["--find-links", str(wheels)] if wheels else [] if offline else ["--extra-index-url", index]
    return [
        *pip,
        "install",
        "--isolated",
        "--disable-pip-version-check",  # else it asks our index for "pip" and warns that it has none
        "--require-hashes",
        "--index-url",
        simple.as_uri(),
        *rest,
        "-r",
        requirements,
    ]


def install_commands(root: Path, *, index: str | None = None, offline: bool = False) -> list[str]:
    """The two install commands, as a user types them (``uv`` and ``pip`` from PATH)."""
    uv = install_argv("uv", root, index=index, offline=offline)
    pip = install_argv("pip", root, index=index, offline=offline)
    return [shlex.join(["uv", *uv[1:]]), shlex.join(pip)]
