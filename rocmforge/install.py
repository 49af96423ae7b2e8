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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import parse_wheel_filename

from rocmforge.errors import UserError

if TYPE_CHECKING:
    from rocmforge.wheelhouse import Entry

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


def uv_sources(simple: Path, index: str) -> list[str]:
    """uv arguments: this wheelhouse's index first (nothing it holds comes from elsewhere), then
    ``index``; uv's configuration files off, every source-related option given here."""
    # --extra-index-url too: given on the command line it replaces UV_EXTRA_INDEX_URL, whose
    # index would otherwise rank above the default one (and, first-index, answer for it).
    return [
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


def requirements_file(entries: Sequence[Entry], simple: Path, *, index: str | None = None) -> str:
    """The text of ``requirements.txt`` for ``entries``, whose index is ``simple``.

    ``uv pip compile --generate-hashes`` of ``project==version`` for every wheel, for the wheels'
    Python, against ``simple`` first and ``index`` (default :func:`public_index`) for the rest.
    """
    index = index or public_index()
    python = target_python(entries)
    argv = [uv_binary(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--generate-hashes"]
    argv += ["--python-version", python, *uv_sources(simple, index), "-"]
    pins = "".join(f"{e.project}=={e.version}\n" for e in entries)
    proc = subprocess.run(argv, input=pins, capture_output=True, text=True, env=clean_environ())
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"uv could not resolve the stack's runtime requirements from {index}: {last}")
    header = (
        "# The wheels of this wheelhouse and everything they need at run time, exact and hash-pinned,\n"
        f"# resolved for Python {python} with this index first and {index} for the rest.\n"
        "# Install: see `nox -s index` (uv pip sync / pip install --require-hashes).\n"
    )
    return header + proc.stdout


def install_argv(tool: str, root: Path, *, index: str | None = None, python: str | None = None) -> list[str]:
    """The command that makes an environment exactly ``root/requirements.txt``.

    ``uv``: ``uv pip sync`` (anything else in the environment goes), hashes required, sources as
    :func:`uv_sources`. ``pip``: ``pip install --isolated`` (no environment variables, no user
    pip.conf), hashes required, this index first, ``index`` for the rest. ``python``: the
    environment's interpreter (uv ``--python``; pip runs as ``python -m pip``).
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
            *uv_sources(simple, index),
            "--require-hashes",
            requirements,
        ]
    pip = [python, "-m", "pip"] if python else ["pip"]
    return [
        *pip,
        "install",
        "--isolated",
        "--disable-pip-version-check",  # else it asks our index for "pip" and warns that it has none
        "--require-hashes",
        "--index-url",
        simple.as_uri(),
        "--extra-index-url",
        index,
        "-r",
        requirements,
    ]


def install_commands(root: Path, *, index: str | None = None) -> list[str]:
    """The two install commands, as a user types them (``uv`` and ``pip`` from PATH)."""
    uv, pip = install_argv("uv", root, index=index), install_argv("pip", root, index=index)
    return [shlex.join(["uv", *uv[1:]]), shlex.join(pip)]
