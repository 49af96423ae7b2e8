"""``python -m rocmforge provenance`` on damaged wheels: one line each, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


def provenance(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", "provenance", str(path)], capture_output=True, text=True
    )


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


GOOD_MEMBERS = {
    "demo/__init__.py": b"",
    "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    "demo-1.0.dist-info/rocmforge.json": b'{"package": "demo"}',
}


def test_reads_the_record_of_a_wheel(tmp_path):
    proc = provenance(_wheel(tmp_path / "demo-1.0-py3-none-any.whl", GOOD_MEMBERS))
    assert proc.returncode == 0, proc.stderr
    assert '"package": "demo"' in proc.stdout


@pytest.mark.parametrize("damage", ["truncated", "garbage", "no dist-info", "bad json"])
def test_damaged_wheels_are_one_line(tmp_path, damage):
    # Each of these was a BadZipFile, ValueError or JSONDecodeError traceback.
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    if damage == "truncated":
        data = _wheel(tmp_path / "full.whl", GOOD_MEMBERS).read_bytes()
        path.write_bytes(data[: len(data) // 2])
        expect = "not a readable wheel"
    elif damage == "garbage":
        path.write_bytes(b"\x00\xffnot a zip at all")
        expect = "not a readable wheel"
    elif damage == "no dist-info":
        _wheel(path, {"demo/__init__.py": b""})
        expect = "not a readable wheel"
    else:
        _wheel(path, {**GOOD_MEMBERS, "demo-1.0.dist-info/rocmforge.json": b'{"package": '})
        expect = "its rocmforge.json is not valid JSON"
    proc = provenance(path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rocmforge provenance: error: {path}: {expect}")
