"""Terminal output shared by the CLI and the nox sessions: one rich console, on stderr.

The console is made when something first prints: importing rich costs about as much as a no-op
package session, and many runs print nothing through it (nox itself logs "up to date").
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console

# Outside a terminal (a CI log, `2>&1 | tee`) rich would wrap tables at 80 columns, folding
# every path and hint; a log has no width, so give it a wide one unless COLUMNS says otherwise.
LOG_WIDTH = 200


class _OnFirstUse:
    """Stands for rich's ``Console``; the first attribute read creates it (and imports rich)."""

    _made: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if _OnFirstUse._made is None:
            from rich.console import Console

            _OnFirstUse._made = Console(
                stderr=True,
                highlight=False,
                width=None if sys.stderr.isatty() or os.environ.get("COLUMNS") else LOG_WIDTH,
            )
        return getattr(_OnFirstUse._made, name)


console = cast("Console", _OnFirstUse())
