"""Run one long build step: full output to a log file, live progress on the terminal.

Progress is ninja's ``[N/M]`` counter when the output has one, otherwise the elapsed time and
the last line. On a terminal it is one live line (rich); elsewhere (CI logs) a step prints a
start line, a status line every ``quiet_interval`` seconds so a long build does not look hung,
and (both ways) a line with its time when it succeeds; a failure is the caller's to report.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from rocmforge.console import console
from rocmforge.fsutil import inherited_lock_fds

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
# Lines worth showing when a build fails: compiler and linker errors, CMake errors, Python's
# exception line, ninja's FAILED marker, the OOM killer.
_MATTERS = re.compile(
    r"(\berror\b|\bError\b|FAILED:|CMake Error|Traceback|Killed signal|fatal:|undefined reference|"
    r"No such file or directory|ModuleNotFoundError|^\w+Error:)"
)


@dataclass(frozen=True)
class StepResult:
    """How a step ended: exit code, seconds, the log file and the output's last lines."""

    returncode: int
    seconds: float
    log: Path
    tail: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_step(
    label: str,
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log: Path,
    quiet_interval: float = 60.0,
) -> StepResult:
    """Run ``argv`` in ``cwd`` with exactly ``env``; append its output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=400)
    start = time.monotonic()
    with open(log, "a", encoding="utf-8", errors="replace") as fh:
        fh.write(f"\n$ cd {cwd}\n$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            pass_fds=inherited_lock_fds(),  # the build lock outlives us if we are killed
        )
        assert proc.stdout is not None
        live = _live(label) if console.is_terminal else None
        if live is None:  # a log has no live line: say what runs now, even for a short step
            console.print(f"{label}: started", markup=False)
        last_note = start
        try:
            for raw in proc.stdout:
                fh.write(raw)
                line = raw.rstrip()
                tail.append(line)
                now = time.monotonic()
                if live is not None:
                    m = _NINJA.match(line)
                    done, total = (int(m.group(1)), int(m.group(2))) if m else (None, None)
                    live.update(live.task_ids[0], completed=done, total=total, line=line[-80:])
                elif now - last_note >= quiet_interval:
                    last_note = now
                    console.print(f"{label}: {now - start:.0f}s {line[-100:]}", markup=False)
            proc.wait()
        finally:
            if live is not None:
                live.stop()
        seconds = time.monotonic() - start
        fh.write(f"# exit {proc.returncode} after {seconds:.1f}s\n")
    if proc.returncode == 0:
        console.print(f"{label}: done in {seconds:.1f}s", markup=False)
    return StepResult(proc.returncode, seconds, log, tuple(tail))


def _live(label: str):
    """A one-line live display: counter and bar when ninja reports one, elapsed time, last line."""
    # Imported here: rich.progress is the largest import of a package session, and a no-op
    # session (every package up to date) shows no progress at all.
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[line]}", style="dim", markup=False),
        console=console,
        transient=True,
    )
    progress.add_task(label, total=None, line="")
    progress.start()
    return progress


def lines_that_matter(tail: tuple[str, ...] | list[str], limit: int = 15) -> list[str]:
    """The error lines of a failed step (the last ``limit``), or its last lines if none match."""
    hits = [line for line in tail if _MATTERS.search(line)]
    return (hits or list(tail))[-limit:]


def log_path(logs_dir: Path, package: str) -> Path:
    """A new log file for one build of ``package``; ``<package>.log`` links to the latest."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs_dir.mkdir(parents=True, exist_ok=True)
    n = 1
    while (path := logs_dir / f"{package}-{stamp}-{n}.log").exists():
        n += 1
    path.touch()
    latest = logs_dir / f"{package}.log"
    tmp = logs_dir / f".{package}.log.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(path.name)
    os.replace(tmp, latest)
    return path
