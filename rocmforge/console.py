"""Terminal output shared by the CLI and the nox sessions: one rich console, on stderr."""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, highlight=False)
