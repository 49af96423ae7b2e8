"""Terminal output shared by the CLI and the nox sessions: one rich console, on stderr."""

from __future__ import annotations

import os
import sys

from rich.console import Console

# Outside a terminal (a CI log, `2>&1 | tee`) rich would wrap tables at 80 columns, folding
# every path and hint; a log has no width, so give it a wide one unless COLUMNS says otherwise.
LOG_WIDTH = 200

console = Console(
    stderr=True,
    highlight=False,
    width=None if sys.stderr.isatty() or os.environ.get("COLUMNS") else LOG_WIDTH,
)
