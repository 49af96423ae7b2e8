"""Publishing a nightly: one index per arch set, Python cells merged, ``latest`` switched."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from rocmforge.build.publish import publish
from rocmforge.errors import UserError


def _wheel(directory: Path, filename: str, payload: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("payload.txt", payload)
    return path


def _nightly(artifacts: Path, tag: str) -> None:
    """Two arch sets x two Pythons; vllm's abi3 wheel is built by both Python cells."""
    for archs in ("mi300", "mi350"):
        for py, cp in (("3.10", "cp310"), ("3.12", "cp312")):
            cell = artifacts / f"wheelhouse-{archs}--py{py}"
            _wheel(cell, f"torch-2.13.0+rocm7.2-{cp}-{cp}-linux_x86_64.whl", f"{tag} {archs} {py}")
            _wheel(cell, "vllm-0.33.0-cp38-abi3-linux_x86_64.whl", f"{tag} {archs} {py}")


def test_publish_merges_pythons_and_switches_latest(tmp_path):
    site = tmp_path / "site"
    _nightly(tmp_path / "run1", "first")
    published = publish(tmp_path / "run1", site, "1001")
    assert sorted(published) == ["mi300", "mi350"]
    latest = site / "mi300" / "latest"
    assert latest.is_symlink() and latest.resolve() == (site / "mi300" / "1001").resolve()
    names = sorted(p.name for p in latest.glob("*.whl"))
    assert names == [
        "torch-2.13.0+rocm7.2-cp310-cp310-linux_x86_64.whl",
        "torch-2.13.0+rocm7.2-cp312-cp312-linux_x86_64.whl",
        "vllm-0.33.0-cp38-abi3-linux_x86_64.whl",
    ]
    # The abi3 wheel comes from the oldest Python, which every newer one can load.
    with zipfile.ZipFile(latest / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl") as zf:
        assert zf.read("payload.txt") == b"first mi300 3.10"
    torch_page = (latest / "simple" / "torch" / "index.html").read_text()
    assert "cp310" in torch_page and "cp312" in torch_page and "#sha256=" in torch_page
    assert "mi350" not in str(published["mi300"][0].path)

    _nightly(tmp_path / "run2", "second")
    publish(tmp_path / "run2", site, "1002")
    assert latest.resolve() == (site / "mi300" / "1002").resolve()
    assert (site / "mi300" / "1001" / "simple" / "index.html").exists()  # kept for a rollback
    assert not list((site / "mi300").glob(".*partial"))


def test_publish_refuses_what_would_mislead(tmp_path):
    _nightly(tmp_path / "run", "x")
    publish(tmp_path / "run", tmp_path / "site", "7")
    with pytest.raises(UserError, match="release '7' is already published"):
        publish(tmp_path / "run", tmp_path / "site", "7")
    with pytest.raises(UserError, match=r"no wheelhouse-<arch-set>--py<X\.Y> directories"):
        publish(tmp_path / "empty", tmp_path / "site", "8")
    (tmp_path / "bad" / "wheelhouse-mi300--py3.11").mkdir(parents=True)
    with pytest.raises(UserError, match="no wheels; the build of this matrix cell produced nothing"):
        publish(tmp_path / "bad", tmp_path / "site", "9")
