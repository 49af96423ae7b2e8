"""Provenance: what a wheel was built from, stored inside it as ``<name>.dist-info/rocmforge.json``.

Read it back from a wheel file or an installed distribution::

    python -m rocmforge provenance wheelhouse/torch-2.13.0+rocm7.2-*.whl
    python -m rocmforge provenance torch            # the installed distribution
"""

from __future__ import annotations

import argparse
import json
import zipfile
from importlib import metadata
from pathlib import Path

from rocmforge.errors import UserError
from rocmforge.wheelfile import read_member

FILENAME = "rocmforge.json"


def read(target: str) -> dict:
    """Provenance of a wheel file (path) or of an installed distribution (name)."""
    if target.endswith(".whl"):
        path = Path(target)
        if not path.is_file():
            raise UserError(f"{target}: no such wheel; list the wheelhouse with `ls wheelhouse`")
        try:
            data = read_member(path, FILENAME)
        except (zipfile.BadZipFile, ValueError, OSError) as exc:  # truncated download, not a wheel
            raise UserError(f"{target}: not a readable wheel ({exc}); download or build it again") from None
    else:
        try:
            text = metadata.distribution(target).read_text(FILENAME)
        except metadata.PackageNotFoundError:
            raise UserError(f"{target}: not installed here; give a wheel path instead") from None
        data = text.encode() if text is not None else None
    if data is None:
        raise UserError(f"{target}: has no {FILENAME}; it was not built by rocmforge")
    try:
        return json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError: a damaged record
        raise UserError(
            f"{target}: its {FILENAME} is not valid JSON; the wheel is damaged, rebuild it"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI: ``python -m rocmforge provenance WHEEL_OR_DIST``."""
    parser.add_argument("target", help="a .whl file or the name of an installed distribution")


def main(args: argparse.Namespace) -> int:
    """Print the provenance record as JSON on stdout."""
    print(json.dumps(read(args.target), indent=2, sort_keys=True))
    return 0
