"""Integrity: a run killed at any moment leaves a sound wheelhouse, and a plain re-run finishes it.

Real builds of the fixture chain (``examples/fixtures.toml``: patchme, dependent built against
patchme's wheel, hipkernel compiled by hipcc) through the real ``nox``. Each kill is followed by
:func:`wheelhouse_problems`, which reads the wheelhouse the way pip and uv do (index pages, their
``#sha256=`` fragments, ``constraints.txt``, the flat directory) and checks every claim against
the bytes, then by a plain re-run that must succeed and leave nothing behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest
from test_build import ROOT, nox, write_config
from test_wheelhouse import links

from rocmforge.fsutil import file_sha256
from rocmforge.killpoints import VARIABLE
from rocmforge.wheelfile import read_member, wheel_name

pytestmark = pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")

PACKAGES = ("patchme", "dependent", "hipkernel")
BUILD_POINTS = ("source", "venv", "built", "fixed")
PUBLISH_POINTS = ("publish:copied", "publish:staged", "publish:linked", "publish:switched", "published")


def wheelhouse_problems(root: Path) -> list[str]:
    """Everything a reader of the wheelhouse at ``root`` would trip over; [] when it is sound."""
    problems = []
    index = root / "simple" / "index.html"
    dangling = [p.name for p in root.glob("*.whl") if not p.exists()]
    problems += [f"{name}: a name at the root that leads nowhere" for name in dangling]
    if not index.exists():
        if (root / "constraints.txt").exists():
            problems.append("constraints.txt without an index")
        return problems
    indexed: dict[str, str] = {}
    for project in links(index):
        page = root / "simple" / project / "index.html"
        if not page.is_file():
            problems.append(f"{project}: listed, but has no page")
            continue
        for href in links(page):
            path, _, sha = href.partition("#sha256=")
            # Resolved as pip and uv resolve a link: by the URL's text, not through symlinks.
            target = Path(os.path.normpath(root / "simple" / project / unquote(path)))
            if not target.is_file():
                problems.append(f"{project}: the index links {target.name}, which does not exist")
            elif not target.name.endswith(".whl"):
                continue  # a wheel's provenance statement: pip and uv skip it, it claims no sha256
            elif file_sha256(target) != sha:
                problems.append(f"{target.name}: sha256 differs from the index's")
            else:
                indexed[target.name] = sha
    pins = (
        (root / "constraints.txt").read_text().splitlines()[1:] if (root / "constraints.txt").exists() else []
    )
    expected = sorted(f"{wheel_name(n).project}=={wheel_name(n).version}" for n in indexed)
    if sorted(pins) != expected:
        problems.append(f"constraints.txt pins {sorted(pins)}, the index holds {expected}")
    for name in indexed:
        deps = json.loads(read_member(root / name, "rocmforge.json") or b"{}").get("dependencies", {})
        problems += [
            f"{name}: built against {d} {s[:12]}, not in the index"
            for d, s in deps.items()
            if s not in indexed.values()
        ]
    stack = json.loads((root / "stack.json").read_text())
    if {w["filename"]: w["sha256"] for w in stack["wheels"]} != indexed:
        problems.append("stack.json lists other wheels than the index")
    return problems


def leftovers(root: Path) -> list[str]:
    """Temp files and generations a finished run must not leave (wheelhouse and work dirs)."""
    house = root / "out" / "wheelhouse"
    current = os.readlink(house / ".index")
    found = [p.name for p in house.glob(".index-*") if p.name != current]
    found += [str(p.relative_to(root)) for p in (root / "out").glob("**/.*.tmp")]
    return found


def _stale(root: Path, package: str) -> None:
    """Make ``package`` rebuild on the next run (its state names no published wheel)."""
    (root / "out" / package / "state.json").unlink(missing_ok=True)


def _rerun(root: Path, config: Path, tally: Counter) -> None:
    """A plain re-run: it succeeds, and the wheelhouse holds what every package's state records."""
    proc = nox(config, *PACKAGES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    house = root / "out" / "wheelhouse"
    assert wheelhouse_problems(house) == []
    assert leftovers(root) == []
    record = json.loads((house / ".index" / ".record.json").read_text())
    for package in PACKAGES:  # so the next run finds each of them up to date
        state = json.loads((root / "out" / package / "state.json").read_text())
        assert record[state["wheel"]]["sha256"] == state["sha256"], package
    tally["re-runs"] += 1


@pytest.mark.slow
def test_kills_at_every_phase_leave_a_sound_wheelhouse(tmp_path):
    config = write_config(tmp_path)
    first = nox(config, *PACKAGES)
    assert first.returncode == 0, first.stderr[-3000:]
    house = tmp_path / "out" / "wheelhouse"
    tally: Counter = Counter()
    start = time.monotonic()
    # Every point of every package's publication, and every build phase (packages taken in turn).
    targeted = [(point, pkg) for point in PUBLISH_POINTS for pkg in ("patchme", "dependent")]
    targeted += [("publish:switched", "hipkernel")]
    targeted += [(point, PACKAGES[i % 3]) for i, point in enumerate(BUILD_POINTS)]
    # `nox -s index` republishes the same set: a kill in its switch (no package: reindex).
    targeted += [("publish:staged", ""), ("publish:switched", "")]
    for point, package in targeted:
        if package:
            _stale(tmp_path, package)
        sessions = PACKAGES if package else ("index",)
        proc = nox(config, *sessions, env={VARIABLE: f"{point}@{package}" if package else point})
        assert proc.returncode == -signal.SIGKILL, f"{point}@{package} not reached: {proc.stderr[-2000:]}"
        assert wheelhouse_problems(house) == [], f"after a kill at {point}@{package}"
        tally[f"{point} ({package or 'index'})"] += 1
        _rerun(tmp_path, config, tally)

    # The nox process killed while hipcc's build step runs: the step lives on as an orphan that
    # must keep the build lock, so the immediate re-run waits instead of deleting its files.
    for delay in (0.0, 0.5, 1.0):
        _stale(tmp_path, "hipkernel")
        log = tmp_path / "out" / "logs" / "hipkernel.log"
        log.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "hipkernel"],
            env={**os.environ, "ROCMFORGE_CONFIG": str(config)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not (log.exists() and "-m build --wheel" in log.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the build step never started"
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with open(tmp_path / "out" / "hipkernel" / ".lock", "rb") as fh, pytest.raises(BlockingIOError):
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the orphaned build step holds it
        assert wheelhouse_problems(house) == []
        tally["build step (nox killed, step orphaned)"] += 1
        _rerun(tmp_path, config, tally)

    again = nox(config, *PACKAGES)
    assert again.stderr.count(": up to date (") == 3, again.stderr[-3000:]
    kills = sum(n for k, n in tally.items() if k != "re-runs")
    print(f"kills: {kills} {dict(tally)} in {time.monotonic() - start:.0f}s, 0 inconsistent states")
    assert kills >= 20
