"""Running git: argument lists, a fixed environment, one-line errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rocmforge.errors import UserError

# Fixed identity and dates: the commits rocmforge makes (archive import, patches) are
# reproducible; no prompt may ever wait for a password; messages stay parseable (LC_ALL=C).
ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
    "GIT_AUTHOR_NAME": "rocmforge",
    "GIT_AUTHOR_EMAIL": "rocmforge@localhost",
    "GIT_COMMITTER_NAME": "rocmforge",
    "GIT_COMMITTER_EMAIL": "rocmforge@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def run(
    args: list[str],
    *,
    cwd: Path | None = None,
    git_dir: Path | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``git args`` (in ``cwd`` or on ``git_dir``); with ``check`` a failure is a one-line UserError."""
    cmd = ["git", *(["--git-dir", str(git_dir)] if git_dir else []), *args]
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **ENV, **(env or {})}
    )
    if check and proc.returncode != 0:
        shown = " ".join(a for a in args[:2])
        raise UserError(f"git {shown} failed in {cwd or git_dir}: {last_line(proc.stderr)}")
    return proc


def last_line(text: str) -> str:
    """The line of git's stderr that says what went wrong (its last error, else its last line)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ln.startswith(("fatal:", "error:"))]
    if not errors:
        return lines[-1] if lines else "(no output)"
    i = errors[-1]
    # "fatal: unable to connect to host:" puts the reason on the next line.
    return f"{lines[i]} {lines[i + 1]}" if lines[i].endswith(":") and i + 1 < len(lines) else lines[i]


def is_work_tree(path: Path) -> bool:
    """``path`` is the top of its own git work tree (not just somewhere inside another one)."""
    if not (path / ".git").is_dir():
        return False
    return run(["rev-parse", "--git-dir"], cwd=path, check=False).returncode == 0


def resolve(name: str, *, git_dir: Path) -> str | None:
    """The full commit ``name`` (sha, abbreviated sha or ref) stands for, or None."""
    proc = run(["rev-parse", "-q", "--verify", f"{name}^{{commit}}"], git_dir=git_dir, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None
