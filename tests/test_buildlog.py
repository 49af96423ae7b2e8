"""Build steps: the full log on disk, the tail kept, the lines that matter picked out."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from rocmforge.build.log import lines_that_matter, log_path, run_step

# What a failing ninja build prints, shortened: progress lines, then the compiler's error.
_NINJA_FAILURE = """
import sys
for i in range(1, 4):
    print(f"[{i}/5] Building CXX object a{i}.o", flush=True)
print("FAILED: b.o", flush=True)
print("b.cpp:3:10: error: 'x' was not declared in this scope", flush=True)
print("ninja: build stopped: subcommand failed.", flush=True)
sys.exit(1)
"""


def test_failed_step_keeps_its_whole_output_and_names_the_error(tmp_path):
    log = log_path(tmp_path / "logs", "demo")
    result = run_step(
        "demo: build", [sys.executable, "-c", _NINJA_FAILURE], cwd=tmp_path, env=dict(os.environ), log=log
    )
    assert not result.ok and result.returncode == 1
    text = log.read_text()
    assert "[3/5] Building CXX object a3.o" in text and "# exit 1" in text
    assert lines_that_matter(result.tail) == [
        "FAILED: b.o",
        "b.cpp:3:10: error: 'x' was not declared in this scope",
    ]
    # demo.log always points at the latest build's log.
    assert (tmp_path / "logs" / "demo.log").resolve() == log.resolve()


def test_each_build_gets_its_own_log_and_the_link_moves(tmp_path):
    first = log_path(tmp_path, "pkg")
    run_step("pkg", [sys.executable, "-c", "print('one')"], cwd=tmp_path, env=dict(os.environ), log=first)
    second = log_path(tmp_path, "pkg")
    run_step("pkg", [sys.executable, "-c", "print('two')"], cwd=tmp_path, env=dict(os.environ), log=second)
    assert second != first
    assert (tmp_path / "pkg.log").resolve() == second.resolve()
    assert "one" in first.read_text() and "two" not in first.read_text() and "two" in second.read_text()


def test_without_error_lines_the_last_lines_are_shown():
    tail = tuple(f"line {i}" for i in range(30))
    assert lines_that_matter(tail, limit=3) == ["line 27", "line 28", "line 29"]


def test_in_a_log_every_step_says_when_it_starts_and_ends_and_tables_keep_their_width(tmp_path):
    # Piped into a CI log (no terminal), a step under a minute printed nothing at all, and rich
    # wrapped tables at 80 columns.
    script = f"""
import os, sys
from rich.table import Table
from rocmforge.build.log import run_step
from rocmforge.console import console
run_step("demo: build", [sys.executable, "-c", "print('hi')"], cwd={str(tmp_path)!r},
         env=dict(os.environ), log=__import__("pathlib").Path({str(tmp_path / "demo.log")!r}))
run_step("demo: fail", [sys.executable, "-c", "raise SystemExit(3)"], cwd={str(tmp_path)!r},
         env=dict(os.environ), log=__import__("pathlib").Path({str(tmp_path / "demo.log")!r}))
table = Table()
table.add_column("fix")
table.add_row("x" * 150)
console.print(table)
"""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    lines = proc.stderr.splitlines()
    assert lines[0] == "demo: build: started"
    assert re.fullmatch(r"demo: build: done in \d+\.\ds", lines[1])
    assert lines[2] == "demo: fail: started"  # a failure's end is the caller's report
    assert any("x" * 150 in line for line in lines[3:])  # one row, not folded at 80 columns
