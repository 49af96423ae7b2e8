"""What every fetch into the per-user cache shares: how network failures are retried, what an
unreachable host is told, the message of a run waiting for a lock, the atomic swap of a tree.

``RETRY_DELAYS`` is read at each retry (``cache.RETRY_DELAYS``), so tests can shorten it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from rocmforge.console import console

# Seconds to wait before each retry of a network operation; the last failure is reported.
RETRY_DELAYS: tuple[float, ...] = (2.0, 5.0, 15.0)

# A name that does not resolve: no DNS on this machine (air-gapped, offline). Retrying rarely
# helps and cost 22 s before the same answer, so it is one line at once.
UNRESOLVED_RE = re.compile(
    r"could not resolve host|name or service not known|temporary failure in name resolution"
    r"|no address associated with hostname|nodename nor servname",
    re.IGNORECASE,
)

OFFLINE_FIX = (
    "check the connection, or build offline from a filled cache or an export (README: Air-gapped clusters)"
)


def waiting(what: str):
    """``file_lock``'s ``on_wait``: says which run holds the lock on ``what``."""

    def say(holder: str) -> None:
        console.print(f"waiting for {what}: held by {holder or 'another run'}")

    return say


def replace_tree(staging: Path, tree: Path) -> None:
    """Swap a finished tree into place: rename is atomic, deleting the old one comes after."""
    old = None
    if tree.exists():
        old = tree.parent / f".{tree.name}.old-{os.getpid()}"
        os.replace(tree, old)
    os.replace(staging, tree)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
