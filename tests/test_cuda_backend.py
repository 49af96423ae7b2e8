"""The CUDA backend end to end: the same recipes and noxfile, nvcc compiling for build.cuda_arch.

``examples/cuda.toml`` builds the fixture chain and ``cudakernel``, a CUDA kernel that nvcc
compiles for ``TORCH_CUDA_ARCH_LIST`` (which rocmforge's build environment takes from
``build.cuda_arch``). nvcc needs no GPU, so the build and verify's static checks run anywhere
nvcc is installed; the kernel itself runs where a CUDA GPU is visible (docs/cuda-e2e.md
records such a run on an H200).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from test_build import nox, write_config

from rocmforge.bench.runner import gpu_device_nodes
from rocmforge.build.wheelfile import read_member
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.verify import inspect

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="needs nvcc on PATH (the CUDA toolkit, e.g. /usr/local/cuda/bin)"
)
CUDA_GPU = any(node.startswith("nvidia") for node in gpu_device_nodes())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """examples/cuda.toml's packages built once through `nox -s dependent cudakernel`."""
    root = tmp_path_factory.mktemp("cuda")
    config = write_config(root, example="cuda.toml")
    proc = nox(config, "dependent", "cudakernel")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return config, Wheelhouse(root / "out" / "wheelhouse")


def _wheel(house: Wheelhouse, project: str) -> Path:
    (entry,) = house.find(project)
    return entry.path


@pytest.mark.slow
def test_cuda_library_holds_sm90_code_only(built):
    _config, house = built
    wheel = _wheel(house, "cudakernel")
    assert inspect.inspect_paths([wheel], ("sm_90",)).missing == []
    # The check can fail: an arch that was not configured is reported missing.
    assert {m.arch for m in inspect.inspect_paths([wheel], ("sm_80",)).missing} == {"sm_80"}


@pytest.mark.slow
def test_provenance_records_the_cuda_toolchain(built):
    _config, house = built
    record = json.loads(read_member(_wheel(house, "cudakernel"), "rocmforge.json"))
    assert record["backend"] == "cuda" and record["arch"] == ["9.0"]
    assert record["env"]["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert record["env"]["USE_CUDA"] == "1" and record["env"]["USE_ROCM"] == "0"
    assert record["compilers"]["nvcc"], record["compilers"]


@pytest.mark.slow
def test_verify_sees_sm90_in_the_built_library(built):
    config, _house = built
    proc = nox(config, "verify", "--", "--no-gpu", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout[proc.stdout.index("{") :])["checks"]}
    (arch_check,) = [c for name, c in checks.items() if name.startswith("archs: cudakernel-")]
    assert arch_check["status"] == "ok" and "sm_90" in arch_check["detail"], arch_check
    assert checks["libraries: cudakernel"]["status"] == "ok"


@pytest.mark.slow
@pytest.mark.skipif(not CUDA_GPU, reason="needs a CUDA GPU (/dev/nvidia0)")
def test_kernel_matches_the_cpu(built, tmp_path):
    _config, house = built
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    install = ["uv", "pip", "install", "-q", "--python", str(python), "--index", house.simple.as_uri()]
    subprocess.run([*install, "cudakernel"], check=True)
    rng = random.Random(0)
    n = 1 << 20
    # float32 inputs, as the kernel sees them; the CPU result in double is then the exact one.
    x = list(array("f", (rng.uniform(-1, 1) for _ in range(n))))
    y = list(array("f", (rng.uniform(-1, 1) for _ in range(n))))
    script = (
        "import json, sys, cudakernel; a, x, y = json.load(sys.stdin); "
        "print(json.dumps(cudakernel.saxpy(a, x, y)))"
    )
    proc = subprocess.run(
        [str(python), "-c", script],
        input=json.dumps([2.5, x, y]),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    gpu = json.loads(proc.stdout)
    worst = max(abs(g - (2.5 * a + b)) for g, a, b in zip(gpu, x, y, strict=True))
    print(f"saxpy of {n} floats on the GPU: max abs difference from the CPU {worst:.2e}")
    assert len(gpu) == n and worst < 1e-6
