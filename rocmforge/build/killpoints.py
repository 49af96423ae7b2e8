"""Named points where the kill test stops a run dead, to prove every state it leaves is sound.

``ROCMFORGE_TEST_KILL_AT=publish:switched@patchme nox -s patchme`` makes the run SIGKILL itself
when patchme reaches that point (no cleanup, no ``finally``: what a power cut or ``kill -9``
does); without ``@PACKAGE`` the first package to reach it. Only ``tests/test_integrity.py`` sets
the variable; unset, a point costs one dictionary lookup.

Points, in the order a package build passes them: ``source`` (tree prepared), ``venv`` (build
venv made), ``built`` (wheel built, not fixed up), ``fixed`` (wheel fixed up, not published),
``publish:copied`` (new wheel copied next to the wheelhouse), ``publish:staged`` (next
generation complete), ``publish:linked`` (root names of new files made), ``publish:switched``
(new generation visible, old one not yet removed), ``published`` (state not yet written).
"""

from __future__ import annotations

import os
import signal

VARIABLE = "ROCMFORGE_TEST_KILL_AT"


def reached(name: str, package: str) -> None:
    """SIGKILL this process if the kill test asked to stop at ``name`` (of ``package``)."""
    if os.environ.get(VARIABLE) in (name, f"{name}@{package}"):
        os.kill(os.getpid(), signal.SIGKILL)
