"""Real GPU objects for the inspect and verify tests: compiled here, or downloaded once from PyPI.

Compilers: Debian's hipcc (ROCm 5.2, gfx908/gfx90a) and clang-19/22 with ``-nogpulib
-nogpuinc`` (gfx942, gfx950, generic targets, ``--offload-compress``). Wheels from PyPI are
cached in ``~/.cache/rocmforge-tests/wheels`` (``ROCMFORGE_TEST_CACHE`` moves it) and checked
against the sha256 PyPI publishes, so a rerun never downloads again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from rocmforge.fsutil import atomic_write, file_lock

# Just enough of the HIP runtime API for clang's -nogpuinc build: the kernel stub calls it.
KERNEL = """\
struct dim3 { unsigned x, y, z; };
typedef struct ihipStream_t *hipStream_t;
extern "C" int hipLaunchKernel(const void *, dim3, dim3, void **, unsigned long, hipStream_t);
extern "C" __attribute__((global)) void %s(float *x, float v) { x[0] += v; }
"""
HIPCC_KERNEL = """\
#include <hip/hip_runtime.h>
__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" int launch(float *x) { hipLaunchKernelGGL(add_one, dim3(1), dim3(32), 0, 0, x); return 0; }
"""
CACHE = Path(os.environ.get("ROCMFORGE_TEST_CACHE", Path.home() / ".cache" / "rocmforge-tests"))
BUNDLER = shutil.which("clang-offload-bundler-22") or "/usr/lib/llvm-22/bin/clang-offload-bundler"


# Where each tool the tests run comes from on Debian 12 (`apt install clang` would bring
# clang-14, and llvm-readelf-22 is no package name); .ci/run installs all but nvcc.
INSTALL = {
    "clang++-22": "apt-get install clang-22 lld-22",
    "clang++-19": "apt-get install clang-19 lld-19",
    "llvm-ar-22": "apt-get install llvm-22",
    "llvm-readelf-22": "apt-get install llvm-22",
    "hipcc": "apt-get install hipcc",
    "cc": "apt-get install gcc",
}


def need(tool: str) -> str:
    """The path of ``tool``, or skip the test saying which package provides it."""
    path = shutil.which(tool)
    if not path:
        if tool == "nvcc":
            pytest.skip(
                "nvcc not installed: the CUDA toolkit; these tests run on a CUDA host (docs/cuda-e2e.md)"
            )
        how = f"Debian 12: {INSTALL[tool]}, as .ci/run does" if tool in INSTALL else "see .ci/run"
        pytest.skip(f"{tool} not installed ({how})")
    return path


def clang_hip(
    out: Path,
    archs: list[str],
    *,
    clang: str = "clang++-22",
    kernel: str = "add",
    compress: bool = False,
    shared: bool = True,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Path:
    """Compile one kernel with clang for ``archs`` into a shared object (or ``-c`` object)."""
    src = out.with_suffix(".hip")
    src.write_text(KERNEL % kernel)
    cmd = [need(clang), "-x", "hip", "-nogpulib", "-nogpuinc", "-fPIC", *extra]
    cmd += [f"--offload-arch={a}" for a in archs]
    cmd += ["--offload-compress"] if compress else []
    cmd += ["-shared"] if shared else ["-c"]
    subprocess.run([*cmd, str(src), "-o", str(out)], check=True, env={**os.environ, **(env or {})})
    return out


def hipcc(out: Path, archs: list[str], *, link: tuple[str, ...] = ()) -> Path:
    """Compile a HIP kernel with Debian's hipcc (AMD platform) into a shared object.

    ``link`` comes after the source, where the linker wants libraries (``-L dir -l:libx.so.2``).
    """
    src = out.with_suffix(".hip")
    src.write_text(HIPCC_KERNEL)
    cmd = [need("hipcc"), "-fPIC", "-shared", *[f"--offload-arch={a}" for a in archs]]
    # TMPDIR: clang's offload steps leave an empty directory per kernel (/tmp/add_one-XXXXXX).
    env = {**os.environ, "HIP_PLATFORM": "amd", "TMPDIR": str(out.parent)}
    subprocess.run([*cmd, str(src), *link, "-o", str(out)], check=True, env=env)
    return out


def bundler_list(blob: bytes, tmp: Path) -> set[str]:
    """The entry IDs ``clang-offload-bundler --list`` reads from one bundle's bytes."""
    if not os.path.exists(BUNDLER):
        pytest.skip("clang-offload-bundler-22 not installed (Debian 12: apt-get install clang-tools-22)")
    path = tmp / "bundle.bin"
    path.write_bytes(blob)
    res = subprocess.run(
        [BUNDLER, "--list", "--type=o", f"--input={path}"], capture_output=True, text=True, check=True
    )
    return set(res.stdout.split())


def pypi_wheel(project: str, version: str, tag: str) -> Path:
    """A wheel of ``project==version`` whose file name contains ``tag``, downloaded once.

    Uses PyPI's JSON API for the URL and sha256; skips the test (with the reason) offline.
    """
    wheels = CACHE / "wheels"
    hits = [p for p in wheels.glob(f"{project.replace('-', '_')}-{version}-*.whl") if tag in p.name]
    if hits:
        return hits[0]
    api = f"https://pypi.org/pypi/{project}/json"
    try:
        with urllib.request.urlopen(api, timeout=30) as resp:
            files = json.load(resp)["releases"].get(version, [])
    except OSError as exc:
        pytest.skip(f"PyPI unreachable ({exc}); {project} {version} is not cached in {wheels}")
    info = next((f for f in files if f["filename"].endswith(".whl") and tag in f["filename"]), None)
    if info is None:
        pytest.skip(f"PyPI has no {project} {version} wheel matching {tag!r}")
    url = info["url"]
    if not url.startswith("https://"):  # some mirrors answer with a path relative to the API
        url = "https://files.pythonhosted.org/packages/" + url.rsplit("packages/", 1)[-1]
    target = wheels / info["filename"]
    with file_lock(wheels / ".download.lock", what=f"download {info['filename']}"):
        if not target.exists():
            try:
                with urllib.request.urlopen(url, timeout=300) as resp:
                    data = resp.read()
            except OSError as exc:
                pytest.skip(f"cannot download {url}: {exc}")
            if hashlib.sha256(data).hexdigest() != info["digests"]["sha256"]:
                pytest.fail(f"sha256 mismatch for {url}")
            atomic_write(target, data)
    return target
