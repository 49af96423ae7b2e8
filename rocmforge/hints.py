"""How to get a missing or too-old tool on this distribution: the data is ``hints.toml``.

The doctor and the compile cache print these next to a failed check. One text per tool and
distribution (``debian-12``, ``ubuntu-22.04``, ``ubuntu-24.04``, ``rhel-9``), because the route
differs: Debian 12 has no gcc-13 package at all, Ubuntu 22.04 needs a PPA, RHEL a toolset.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# g++ comes from the same packages as gcc.
_SAME_AS = {"g++": "gcc"}


@functools.cache
def _table() -> dict[str, dict[str, str]]:
    return tomllib.loads((Path(__file__).with_name("hints.toml")).read_text())


def install_hint(tool: str, os_id: str, *, spec: str = "", root: bool | None = None) -> str:
    """How to install ``tool`` (meeting ``spec``, e.g. ``>=13``) on the distribution ``os_id``.

    ``root``: whether the user is root (default: this process's user), who runs package
    managers without ``sudo`` (a container as root often has no sudo at all).
    """
    entry = _table().get(_SAME_AS.get(tool, tool))
    if entry is None:
        return f"install {tool} {spec}".strip()
    root = os.geteuid() == 0 if root is None else root
    text = entry.get(os_id, entry["default"])
    return text.format(spec=spec, major=_major(spec), sudo="" if root else "sudo ")


def _major(spec: str) -> str:
    """The major version to install for ``spec``: ``>=13`` -> 13, ``<13`` -> 12, ``<=12.3`` -> 12."""
    bounds = [c.strip() for c in spec.split(",") if c.strip()]
    lower = next((c for c in bounds if c[0] in ">=~"), None)
    if lower:
        return lower.lstrip(">=~").split(".")[0]
    upper = next((c for c in bounds if c.startswith("<")), None)
    if upper is None:
        return ""
    number = upper.lstrip("<=")
    major = number.split(".")[0]
    # "<13" excludes 13.0 itself; "<13.2" and "<=13" still admit a 13.
    if upper.startswith("<=") or "." in number.rstrip(".0") or not major.isdigit():
        return major
    return str(int(major) - 1)
