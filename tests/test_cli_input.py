"""Bad input to the CLI: one line, exit 2, no traceback and no hang (each run has a time limit).

Wrong files (random bytes, empty, text named .so, a zip that is not a wheel) must never pass
``inspect --require``; named pipes and devices are refused before anything opens them (reading
one blocks until a writer comes, or never ends); ``arch`` reads a bounded amount; a closed
stdout (``... | head``) ends the command quietly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 20  # seconds for any one command: a hang shows up as a timeout, not a stuck suite


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", *args],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"},
    )


def _one_error_line(res: subprocess.CompletedProcess, command: str, expected: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rocmforge {command}: error: "), res.stderr
    assert expected in lines[0], lines[0]


@pytest.fixture
def bad(tmp_path):
    """The wrong files a user can hand the CLI, by kind."""
    files = {
        "random bytes": tmp_path / "random.bin",
        "empty": tmp_path / "empty.so",
        "text named .so": tmp_path / "libtext.so",
        "zip without dist-info": tmp_path / "plain.zip",
        "named pipe": tmp_path / "pipe",
    }
    files["random bytes"].write_bytes(b"\1" + os.urandom(4095).replace(b"\0", b"\2"))
    files["empty"].write_bytes(b"")
    files["text named .so"].write_text("not a shared object\n" * 10)
    with zipfile.ZipFile(files["zip without dist-info"], "w") as zf:
        zf.writestr("data.bin", b"\0" * 200)
    os.mkfifo(files["named pipe"])
    files["device"] = Path(os.devnull)
    return files


INSPECT_ERRORS = {
    "random bytes": "not an ELF object, archive, code object or wheel",
    "empty": "empty file",
    "text named .so": "not an ELF object, archive, code object or wheel",
    "zip without dist-info": "a zip archive but not a wheel (no .dist-info/), and no objects",
    "named pipe": "a named pipe, not a regular file",
    "device": "a character device, not a regular file",
}


@pytest.mark.timeout(6 * LIMIT)
@pytest.mark.parametrize("kind", sorted(INSPECT_ERRORS))
def test_inspect_refuses_what_is_not_an_object_and_it_never_passes_require(bad, kind):
    path = str(bad[kind])
    _one_error_line(run_cli("inspect", path), "inspect", f"{path}: {INSPECT_ERRORS[kind]}")
    _one_error_line(run_cli("inspect", path, "--require", "gfx942"), "inspect", INSPECT_ERRORS[kind])
    _one_error_line(run_cli("inspect", "--json", path), "inspect", INSPECT_ERRORS[kind])


@pytest.mark.timeout(3 * LIMIT)
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("named pipe", "a named pipe, not a regular file; give the build or run log"),
        ("device", "a character device, not a regular file"),
        ("random bytes", "not a text log (binary data)"),
        ("empty", "empty; give the log of the failed build or run"),
    ],
)
def test_diagnose_says_when_its_input_is_not_a_text_log(bad, kind, expected):
    _one_error_line(run_cli("diagnose", str(bad[kind])), "diagnose", f"{bad[kind]}: {expected}")


@pytest.mark.timeout(3 * LIMIT)
def test_diagnose_reads_a_binary_stdin_as_no_log(bad):
    res = subprocess.run(
        [sys.executable, "-m", "rocmforge", "diagnose", "-"],
        input=bad["random bytes"].read_bytes(),
        capture_output=True,
        timeout=LIMIT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 2 and b"standard input: not a text log" in res.stderr


@pytest.mark.timeout(3 * LIMIT)
@pytest.mark.parametrize("command", ["arch", "provenance", "check-node"])
def test_other_readers_refuse_pipes_and_devices_at_once(bad, tmp_path, command):
    pipe = tmp_path / "pipe.whl"  # named like what provenance reads
    os.mkfifo(pipe)
    args = {"arch": [str(pipe)], "provenance": [str(pipe)], "check-node": ["--stack", str(pipe)]}[command]
    _one_error_line(run_cli(command, *args), command, f"{pipe}: a named pipe, not a regular file")


@pytest.mark.timeout(3 * LIMIT)
def test_arch_reads_a_bounded_amount(tmp_path):
    big = tmp_path / "huge.log"
    line = b"Name:                    gfx942\n"
    with open(big, "wb") as fh:  # 64 MiB of text that looks like rocminfo
        block = line * ((1 << 20) // len(line))
        for _ in range(64):
            fh.write(block)
    start = time.monotonic()
    res = run_cli("arch", str(big))
    _one_error_line(res, "arch", f"{big}: larger than 16 MiB, not tool output")
    assert time.monotonic() - start < LIMIT


@pytest.mark.timeout(3 * LIMIT)
def test_a_closed_stdout_ends_the_command_quietly():
    rocminfo = next((ROOT / "tests" / "data" / "arch").glob("rocminfo*"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmforge", "arch", "--json", str(rocminfo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line
    _, err = proc.communicate(timeout=LIMIT)
    assert err.decode() == ""
    assert proc.returncode == 128 + signal.SIGPIPE


@pytest.mark.timeout(3 * LIMIT)
def test_require_fails_when_there_is_no_gpu_code_to_check(tmp_path):
    # A directory with no objects in it (the wrong one, mistyped) passed the gate with exit 0.
    (tmp_path / "notes.txt").write_text("nothing here\n")
    res = run_cli("inspect", str(tmp_path), "--require", "gfx942")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert (
        res.stderr.strip().splitlines()[-1]
        == "FAIL: --require gfx942: no GPU code found, so nothing covers it"
    )
    assert run_cli("inspect", str(tmp_path)).returncode == 0  # without --require it is only a listing
