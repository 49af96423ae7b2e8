"""``diagnose LOG --excerpt PATH --source URL``: a failure of one's own, as a corpus fixture.

The blind rounds of issue 15 found the engine weakest on ROCm-side failures, where public
threads are running out; our users' own logs are the data it lacks. This writes one in the
format of ``tests/data/diagnose/`` (two header lines, then the lines that matter): the lines
around the first fatal error and around the evidence, at most ``MAX_LINES``, without colour
codes or progress redraws, with home directories made anonymous. The category line says what
the engine answered; whoever submits it corrects it to what fixed the failure.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from rocmforge.diagnose.text import terminal_text
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write

if TYPE_CHECKING:
    from rocmforge.diagnose.engine import Diagnosis

MAX_LINES = 80  # the corpus's own limit on an excerpt
ABOVE_FIRST, BELOW = 10, 3  # a first error is read from the lines above it (its includes, its command)
AROUND = 3  # other evidence: a few lines either side
TAIL = 40  # no error line at all: the end of the log, where a failed step stops
LINE_CHARS = 2000  # a minified command line or a dumped buffer: its head says what it is

# /home/alice/, /Users/alice/, C:\Users\alice\ -> a name that says nothing about the submitter.
_HOME = re.compile(r"(?P<root>/home/|/Users/|[A-Za-z]:\\Users\\)(?P<name>[^/\\\s'\"]+)")
_URL = re.compile(r"https?://\S+")
_GITHUB = re.compile(r"https://github\.com/[^/]+/(?P<repo>[^/]+)/(?:issues|pull|discussions)/(?P<number>\d+)")


def anchors(diagnosis: Diagnosis) -> list[tuple[int, int, int]]:
    """``(line, above, below)`` windows to keep: the first fatal error's first, then the evidence."""
    out = []
    if diagnosis.first_error is not None:
        out.append((diagnosis.first_error.line, ABOVE_FIRST, BELOW))
    evidence = list(diagnosis.evidence)
    if diagnosis.secondary is not None:
        evidence += diagnosis.secondary.evidence
    out += [(e.line, AROUND, AROUND) for e in evidence]
    return out


def wanted_lines(windows: Iterable[tuple[int, int, int]], limit: int = MAX_LINES) -> set[int]:
    """The line numbers of the windows, in order of priority, until ``limit`` lines are taken."""
    keep: set[int] = set()
    for line, above, below in windows:
        window = set(range(max(1, line - above), line + below + 1))
        if len(keep | window) > limit:
            continue  # a later, smaller window may still fit
        keep |= window
    return keep


def clean(line: bytes) -> str:
    """A log line as the terminal showed it (as the engine reads it), its home directory anonymous."""
    text = _HOME.sub(lambda m: m["root"] + "user", terminal_text(line))
    return text if len(text) <= LINE_CHARS else text[:LINE_CHARS] + " [...]"


def select(lines: Iterable[bytes], keep: set[int]) -> list[str]:
    """The kept lines of a log read once, or its last ``TAIL`` lines when nothing is kept."""
    if keep:
        return [clean(line) for n, line in enumerate(lines, 1) if n in keep]
    return [clean(line) for line in deque(lines, maxlen=TAIL)]


def fixture_name(category: str, source: str) -> str:
    """The corpus's file name: ``<category>-<repo>-<number>.log`` for a GitHub thread."""
    m = _GITHUB.match(source)
    if m:
        return f"{category}-{m['repo'].lower()}-{m['number']}.log"
    slug = re.sub(r"[^a-z0-9]+", "-", source.split("://", 1)[-1].lower()).strip("-")[-40:]
    return f"{category}-{slug}.log"


def _refuse_existing(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: already exists; give another --excerpt path (nothing was written)")


def check_request(out: str | Path, source: str | None) -> None:
    """A ``UserError`` unless ``source`` is the http(s) URL of a thread and ``out`` is free.

    Checked before the log is read, so that a bad request costs nothing and prints no diagnosis.
    """
    if not source or not _URL.fullmatch(source):
        raise UserError(
            "--excerpt needs --source URL: the http(s) address of the issue or discussion that records "
            "this failure and what fixed it (tests/data/diagnose/README.md)"
        )
    _refuse_existing(Path(out))
    if str(out).endswith(("/", "\\")) and not Path(out).is_dir():
        raise UserError(f"{out}: no such directory; create it, or give the excerpt's file name")


def write_excerpt(log: str | Path, diagnosis: Diagnosis, out: str | Path, source: str) -> Path:
    """Write the excerpt of ``log`` for ``diagnosis`` to ``out`` (a file, or a directory to name it in).

    ``source`` is the thread where the failure and its fix are recorded (the corpus keeps one
    excerpt per thread and splits by thread); :func:`check_request` has accepted both. A name
    chosen in a directory is known only now, from the category, so it is checked here.
    """
    out = Path(out)
    path = out / fixture_name(diagnosis.category, source) if out.is_dir() else out
    _refuse_existing(path)
    keep = wanted_lines(anchors(diagnosis))
    try:
        with open(log, "rb") as f:
            body = select(f, keep)
    except OSError as exc:
        raise UserError(f"{log}: cannot read the log again for its excerpt ({exc.strerror or exc})") from None
    header = [f"# source: {source}", f"# category: {diagnosis.category}"]
    atomic_write(path, "\n".join(header + body) + "\n")
    return path
