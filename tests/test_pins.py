"""``python -m rocmforge pins --from-vllm``: the stack read out of real vLLM releases from PyPI.

The sdists (about 40 MB each) are downloaded once into ``~/.cache/rocmforge-tests/cache``
(``ROCMFORGE_TEST_CACHE`` moves it), checked against the sha256 PyPI lists, and reused by later
runs. The expected pins are the ones vLLM's Dockerfiles write (also quoted in issue 11).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rocmforge.config import load_config, tomllib
from rocmforge.errors import UserError
from rocmforge.sources.pins import parse_dockerfile, stack_from_files, write_pins

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ROCMFORGE_TEST_CACHE", Path.home() / ".cache" / "rocmforge-tests")) / "cache"
# What each release's Dockerfile pins (pytorch, triton, torchvision, aiter, mori) and where.
RELEASES = {
    "0.27.0": ("docker/Dockerfile.rocm_base", "d0c8b1f3", "0f380657", "v0.24.1", "v0.1.19", "v1.1.0"),
    "0.30.0": ("docker/Dockerfile.rocm_base", "6bbd260", "f0b55c0", "v0.27.1", "v0.1.21.post2", "v1.1.0"),
    "0.33.0": ("docker/Dockerfile.rocm_72_base", "733fca1", "669b31a", "v0.28.0", "v0.1.26", "v1.2.3.post1"),
}


def pins(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROCMFORGE_CACHE": str(CACHE)}
    env.pop("ROCMFORGE_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", "pins", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


@pytest.fixture(scope="module")
def stacks() -> dict[str, dict]:
    """``pins --from-vllm VERSION --json`` of each release: downloaded (first run) and checked."""
    out = {}
    for version in RELEASES:
        proc = pins("--from-vllm", version, "--json")
        assert proc.returncode == 0, proc.stderr
        out[version] = json.loads(proc.stdout)
    return out


def sdist(version: str) -> Path:
    """The cached sdist the ``stacks`` fixture downloaded."""
    (path,) = CACHE.glob(f"archives/*/vllm-{version}.tar.gz")
    return path


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
def test_each_release_gives_the_pins_its_dockerfile_writes(stacks, version):
    dockerfile, torch, triton, vision, aiter, mori = RELEASES[version]
    stack = stacks[version]
    assert set(stack) == {"vllm", "dockerfile", "rocm", "python", "arch", "packages"}
    assert (stack["vllm"], stack["dockerfile"], stack["rocm"], stack["python"]) == (
        version,
        dockerfile,
        "7.2.3",
        "3.12",
    )
    assert stack["arch"][:3] == ["gfx90a", "gfx942", "gfx950"] and "gfx1100" in stack["arch"]
    packages = stack["packages"]
    assert list(packages) == ["pytorch", "triton", "torchvision", "torchaudio", "flash_attn", "aiter", "mori"]
    revs = {name: p["rev"] for name, p in packages.items()}
    assert (revs["pytorch"], revs["triton"], revs["torchvision"], revs["aiter"], revs["mori"]) == (
        torch,
        triton,
        vision,
        aiter,
        mori,
    )
    assert packages["pytorch"]["url"] == "https://github.com/ROCm/pytorch.git"
    assert packages["flash_attn"] == {
        "url": "https://github.com/Dao-AILab/flash-attention.git",
        "rev": "0e60e394",
    }


@pytest.mark.slow
@pytest.mark.network
def test_the_default_config_is_what_write_makes_of_0_33_0(stacks, tmp_path):
    """Every pin of build_config.toml equals vLLM 0.33.0's Dockerfile: --write changes nothing."""
    config = tmp_path / "build_config.toml"
    shutil.copy(ROOT / "build_config.toml", config)
    proc = pins("--from-vllm", str(sdist("0.33.0")), "--write", str(config))
    assert proc.returncode == 0, proc.stderr
    assert "0 change(s), already up to date" in proc.stderr
    assert config.read_bytes() == (ROOT / "build_config.toml").read_bytes()
    assert "pytorch      733fca1        https://github.com/ROCm/pytorch.git  (release/2.13 as of 09/17)" in (
        proc.stdout
    )


@pytest.mark.slow
@pytest.mark.network
def test_write_moves_the_config_to_another_release_keeping_its_comments(stacks, tmp_path):
    config = tmp_path / "build_config.toml"
    shutil.copy(ROOT / "build_config.toml", config)
    before = config.read_text().splitlines()
    proc = pins("--from-vllm", str(sdist("0.30.0")), "--write", str(config))
    assert proc.returncode == 0, proc.stderr
    after = config.read_text().splitlines()
    # Only the pin lines changed; every comment line and every other line is where it was.
    assert len(after) == len(before)
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert all(
        b.split("=")[0].strip() in ("rev", "commit", "version", "sha256", "rocm_version") for _a, b in changed
    )
    assert [ln for ln in before if ln.startswith("#")] == [ln for ln in after if ln.startswith("#")]
    cfg = load_config(config, environ={})
    torch, triton = cfg.package("pytorch"), cfg.package("triton")
    assert (torch.source.rev, torch.source.commit, torch.version) == ("release/2.12", "6bbd260", "2.12.0")
    assert (triton.source.rev, triton.source.commit, triton.version) == (
        "release/internal/3.7.x",
        "f0b55c0",
        "3.7.0",
    )
    vision = cfg.package("torchvision")
    assert (vision.source.rev, vision.source.commit, vision.version) == ("v0.27.1", None, "0.27.1")
    assert cfg.package("aiter").source.rev == "v0.1.21.post2"
    vllm = cfg.package("vllm")
    assert (vllm.version, vllm.source.version) == ("0.30.0", "0.30.0")
    assert vllm.source.sha256 == "5f8f4e890c042ffa1c3e103f81c35e2d96f60a0a175ac43a4adbae7006bef62b"
    assert 'commit = "6bbd260"                      # from vLLM 0.30.0 docker/Dockerfile.rocm_base' in after
    assert "abbreviated commits (flash_attn 0e60e394, pytorch 6bbd260, triton f0b55c0)" in proc.stderr


@pytest.mark.slow
@pytest.mark.network
def test_an_unpacked_tree_reads_like_its_sdist(stacks, tmp_path):
    with tarfile.open(sdist("0.27.0")) as tf:
        members = [m for m in tf.getmembers() if "/docker/" in m.name or m.name.endswith("/PKG-INFO")]
        # Debian 12's python3 (3.11.2) predates extraction filters.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(tmp_path, members=members, **safe)
    proc = pins("--from-vllm", str(tmp_path / "vllm-0.27.0"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == stacks["0.27.0"]


def test_arg_values_lose_quotes_and_comments_and_the_first_default_wins():
    text = (
        'ARG TRITON_BRANCH="669b31a" # release/internal/3.8.x as of 09/17\n'
        "ARG PYTORCH_ROCM_ARCH=gfx90a;gfx942\n"
        "ENV AITER_ROCM_ARCH=gfx942;gfx950\n"
        "FROM base AS build_triton\n"
        "ARG TRITON_BRANCH\n"
        "ARG PYTORCH_ROCM_ARCH=gfx1100\n"
    )
    assert parse_dockerfile(text) == {
        "TRITON_BRANCH": ("669b31a", "release/internal/3.8.x as of 09/17"),
        "PYTORCH_ROCM_ARCH": ("gfx90a;gfx942", ""),
        "AITER_ROCM_ARCH": ("gfx942;gfx950", ""),
    }


def test_a_layout_without_a_source_build_is_one_clear_error(tmp_path):
    # 0.33's rocm_base alone installs prebuilt torch: nothing to read pins from.
    files = {"docker/Dockerfile.rocm_base": "ARG TORCH_VERSION=2.13.0+rocm10.0.0\n"}
    with pytest.raises(UserError, match=r"unrecognised layout: looked for docker/Dockerfile\.rocm_72_base"):
        stack_from_files(files, "9.9.9", where="vLLM 9.9.9")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile.rocm_base").write_text(files["docker/Dockerfile.rocm_base"])
    proc = pins("--from-vllm", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "without ARG PYTORCH_BRANCH" in line and line.startswith("rocmforge pins: error: ")


def test_bad_arguments_are_one_line_each(tmp_path):
    proc = pins("--from-vllm", "not-a-version")
    assert proc.stderr.strip() == (
        "rocmforge pins: error: --from-vllm not-a-version: not a vLLM version (e.g. 0.33.0), "
        "an sdist file or a directory"
    )
    broken = tmp_path / "vllm-0.33.0.tar.gz"
    broken.write_bytes(b"not gzip")
    proc = pins("--from-vllm", str(broken))
    assert (
        proc.returncode == 2 and "not a readable sdist" in proc.stderr and len(proc.stderr.splitlines()) == 1
    )


def test_write_leaves_tables_it_does_not_know_and_says_so():
    text = (ROOT / "examples" / "vllm-empty.toml").read_text()
    files = {
        "docker/Dockerfile.rocm_72_base": 'ARG PYTORCH_BRANCH="733fca1"\nARG PYTORCH_REPO="https://x/pytorch.git"\n'
        'ARG TRITON_BRANCH="669b31a"\nARG TRITON_REPO="https://x/triton.git"\n'
    }
    new, changed, skipped = write_pins(text, stack_from_files(files, None, where="t"))
    assert new == text and changed == []
    assert skipped == [
        "pytorch (no [packages.pytorch.source] table)",
        "triton (no [packages.triton.source] table)",
    ]
    tomllib.loads(new)
