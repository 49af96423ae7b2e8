"""The stack rehearsal: the real `pytorch`, `triton` and `torchvision` recipes, Triton's derived
pin and the exact pins between the wheels, end to end.

``examples/stack.toml`` builds three small projects that really compile, shaped like PyTorch,
ROCm/triton and torchvision where the recipes look (``examples/fixtures/minitorch``,
``minitriton``, ``minivision``): a real hipify step, hipcc per arch, ``PYTORCH_BUILD_VERSION``,
torch's Requires-Dist on ``pytorch-triton-rocm`` (dropped) and on our triton (exact, through
``PYTORCH_EXTRA_INSTALL_REQUIREMENTS``), Triton's commit read from the torch tree's
``.ci/docker`` files, torchvision's C extension compiled against the torch wheel and pinned to
it (``PYTORCH_VERSION``). The real ``nox`` sessions build them; the wheels are installed
together and checked by ``rocmforge verify --no-gpu``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_build import EXAMPLES, ROOT, _make_repos, nox, venv_with, write_config

from rocmforge.build.wheelfile import read_member, read_metadata
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.config import load_config
from rocmforge.sources.checkout import PYTORCH_TRITON_COMMIT
from rocmforge.verify import inspect

pytestmark = pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")
TRITON_REQUIREMENT = 'pytorch-triton-rocm==0.3.0+git{short}; platform_system == "Linux"'


def stack_config(root: Path, *, triton: str | None = None) -> Path:
    """``examples/stack.toml`` under ``root``; ``triton`` replaces the tables from the Triton
    package's on (torch then no longer depends on it, and torchvision is left out)."""
    config = write_config(root, example="stack.toml")
    if triton is not None:
        text = config.read_text().replace('depends = ["triton"]', "depends = []")
        config.write_text(text[: text.index("[packages.triton]")] + triton)
    return config


def record_of(wheel: Path) -> dict:
    return json.loads(read_member(wheel, "rocmforge.json"))


def commit_of(repo: Path, rev: str = "HEAD") -> str:
    return subprocess.run(
        ["git", "rev-parse", rev], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """`nox -s pytorch triton torchvision` on the stack example, once."""
    root = tmp_path_factory.mktemp("stack")
    config = stack_config(root)
    start = time.monotonic()
    proc = nox(config, "pytorch", "triton", "torchvision")
    print(f"fresh build of minitriton + minitorch + minivision: {time.monotonic() - start:.1f}s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, config, Wheelhouse(root / "out" / "wheelhouse"), proc


@pytest.mark.slow
def test_hipify_ran_and_the_library_holds_gfx90a_code(stack):
    root, _config, house, _proc = stack
    tree = root / "out" / "third_party" / "pytorch"
    hipified = sorted(p.name for p in (tree / "csrc" / "hip").glob("*.hip"))
    assert hipified == ["add_one.hip", "scale.hip"]
    text = (tree / "csrc" / "hip" / "add_one.hip").read_text()
    assert "#include <hip/hip_runtime.h>" in text and "hipStream_t" in text and "cuda" not in text
    # The ROCm build compiled exactly those (the .cu spellings do not build with HIP_PLATFORM=amd).
    log = (root / "out" / "logs" / "pytorch.log").read_text()
    assert "compiling 2 HIP sources for gfx90a with MAX_JOBS=2" in log
    (torch,) = house.find("torch")
    report = inspect.inspect_paths([torch.path], ("gfx90a",))
    (library,) = [f for f in report.files if f.bundles]
    assert library.member.endswith("torch/lib/libtorch_hip.so")
    assert len(library.bundles) == 2 and library.archs == ["gfx90a"] and not report.missing

    # Idempotent, like PyTorch's: a second run in the built tree writes nothing.
    before = {p: p.stat().st_mtime_ns for p in (tree / "csrc" / "hip").iterdir()}
    again = subprocess.run(
        [sys.executable, "tools/amd_build/build_amd.py"], cwd=tree, capture_output=True, text=True, check=True
    )
    assert "0 file(s) written, 2 already hipified" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in (tree / "csrc" / "hip").iterdir()} == before


@pytest.mark.slow
def test_torch_version_is_pytorch_build_version_and_its_triton_pin_is_dropped(stack):
    root, _config, house, _proc = stack
    (torch,) = house.find("torch")
    assert torch.version == "0.1.0+rocm5.2"
    record = record_of(torch.path)
    assert record["env"]["PYTORCH_BUILD_VERSION"] == "0.1.0+rocm5.2"
    assert record["env"]["USE_ROCM"] == "1" and record["env"]["USE_CUDA"] == "0"
    short = commit_of(root / "repos" / "minitriton")[:8]
    # Our triton, exactly, written by torch's own build (PYTORCH_EXTRA_INSTALL_REQUIREMENTS): no edit.
    assert read_metadata(torch.path).get_all("Requires-Dist") == [f"triton==0.3.0+git{short}"]
    assert record["env"]["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"] == f"triton==0.3.0+git{short}"
    assert record["exact_pins"] == {"triton": f"==0.3.0+git{short}"} and record["pins_added"] == []
    assert record["dropped_requirements"] == [TRITON_REQUIREMENT.format(short=short)]


@pytest.mark.slow
def test_triton_commit_comes_from_the_torch_tree(stack):
    root, config, house, _proc = stack
    assert load_config(config, environ={}).package("triton").source.commit is None
    pinned = (root / "out" / "third_party" / "pytorch" / PYTORCH_TRITON_COMMIT).read_text().strip()
    assert pinned == commit_of(root / "repos" / "minitriton")
    (triton,) = house.find("triton")
    record = record_of(triton.path)
    assert record["source"]["commit"] == pinned
    assert record["source"]["pinned_by"] == f"pytorch's {PYTORCH_TRITON_COMMIT}"
    assert triton.version == f"0.3.0+git{pinned[:8]}"
    # TRITON_HOME from the recipe: the "LLVM download" landed in the cache, not in ~.
    assert (root / "cache" / "triton" / ".triton" / "llvm" / "llvm-a1b2c3d4-ubuntu-x64").is_dir()
    assert "minitriton: MAX_JOBS=2" in (root / "out" / "logs" / "triton.log").read_text()


@pytest.mark.slow
def test_a_triton_pin_that_disagrees_with_the_tree_stops_with_both_values(stack):
    root, config, house, _proc = stack
    (before,) = house.find("triton")
    pinned = commit_of(root / "repos" / "minitriton")
    wrong = "0123456789abcdef0123456789abcdef01234567"
    other = root / "disagree.toml"
    other.write_text(config.read_text().replace('rev = "main"', f'rev = "main"\ncommit = "{wrong}"'))
    proc = nox(other, "triton")
    assert proc.returncode != 0
    (line,) = [ln for ln in proc.stderr.splitlines() if "Session triton aborted" in ln]
    assert (
        f"packages.triton.source.commit = {wrong} but pytorch's {PYTORCH_TRITON_COMMIT} pins {pinned}" in line
    )
    assert "override_pin = true" in line
    assert house.find("triton") == [before]


@pytest.mark.slow
def test_override_pin_keeps_the_configured_commit(tmp_path):
    config = stack_config(tmp_path)
    repo = tmp_path / "repos" / "minitriton"
    pinned = commit_of(repo)
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", *identity, "commit", "-q", "--allow-empty", "-m", "newer"], cwd=repo, check=True)
    newer = commit_of(repo)
    text = config.read_text().replace('rev = "main"', f'rev = "main"\ncommit = "{newer}"')
    config.write_text(text.replace('pin_from = "pytorch"', 'pin_from = "pytorch"\noverride_pin = true'))
    proc = nox(config, "triton")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"triton: keeping commit {newer} over {pinned}" in proc.stderr
    (triton,) = Wheelhouse(tmp_path / "out" / "wheelhouse").find("triton")
    source = record_of(triton.path)["source"]
    assert (
        source["commit"] == newer and "override_pin" in source["pinned_by"] and pinned in source["pinned_by"]
    )


@pytest.mark.slow
def test_adding_our_triton_rebuilds_torch_without_its_triton_pin(tmp_path):
    """Torch built while Triton is not ours keeps its pin; configuring our Triton must drop it."""
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    alone = stack_config(tmp_path, triton="")
    assert nox(alone, "pytorch").returncode == 0
    (torch,) = house.find("torch")
    short = commit_of(tmp_path / "repos" / "minitriton")[:8]
    assert read_metadata(torch.path).get_all("Requires-Dist") == [TRITON_REQUIREMENT.format(short=short)]
    proc = nox(stack_config(tmp_path), "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (changed,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("pytorch: rebuilding, changed: ")]
    assert "dropped" in changed.split(": ", 2)[2].split(", ")
    (torch,) = house.find("torch")
    assert read_metadata(torch.path).get_all("Requires-Dist") == [f"triton==0.3.0+git{short}"]


@pytest.mark.slow
def test_without_a_version_torch_names_itself_and_the_label_is_still_added(tmp_path):
    config = stack_config(tmp_path)
    config.write_text(config.read_text().replace('version = "0.1.0"\n', "", 1))
    proc = nox(config, "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (torch,) = Wheelhouse(tmp_path / "out" / "wheelhouse").find("torch")
    short = commit_of(tmp_path / "repos" / "minitorch")[:7]
    assert torch.version == f"0.1.0a0+git{short}.rocm5.2"
    assert "PYTORCH_BUILD_VERSION" not in record_of(torch.path)["env"]


@pytest.mark.slow
def test_both_wheels_install_together_and_verify_passes(stack, tmp_path):
    _root, config, house, _proc = stack
    # Asking for torchvision alone: its exact pin brings our torch, whose pin brings our triton.
    python = venv_with(tmp_path, "--index", house.simple.as_uri(), "torchvision")
    code = "import torch, triton, torchvision; print(torch.version.__version__, torch.answer(), "
    code += "triton.llvm_hash(), torchvision.__version__, torchvision.answer())"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0.1.0+rocm5.2", "42", "a1b2c3d4", "0.2.0+rocm5.2", "43"]
    verify = ["verify", "--python", str(python), "--wheelhouse", str(house.root), "--no-gpu", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge", *verify],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ROCMFORGE_CONFIG": str(config)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert {c["status"] for c in checks.values()} == {"ok"}
    assert "installed: triton 0.3.0+git" in checks["torch ↔ Triton"]["detail"]
    assert {"one Triton", "pip check", "import torch", "import triton", "import torchvision"} <= set(checks)
    assert checks["torch pins"]["detail"].startswith("triton==0.3.0+git")
    assert checks["torchvision pins"]["detail"] == "torch==0.1.0+rocm5.2 (installed 0.1.0+rocm5.2)"
    (torch,) = house.find("torch")
    assert "(gfx90a); all cover gfx90a" in checks[f"archs: {torch.path.name}"]["detail"]


@pytest.mark.slow
def test_torchvision_is_built_against_our_torch_and_pins_it_exactly(stack):
    root, _config, house, _proc = stack
    (vision,) = house.find("torchvision")
    assert vision.version == "0.2.0+rocm5.2"  # BUILD_VERSION: no relabelling after the build
    record = record_of(vision.path)
    env = record["env"]
    assert (env["BUILD_VERSION"], env["PYTORCH_VERSION"], env["FORCE_CUDA"]) == (
        "0.2.0+rocm5.2",
        "0.1.0+rocm5.2",
        "1",
    )
    # torchvision's own PYTORCH_VERSION switch wrote the exact pin; nothing was edited afterwards.
    assert read_metadata(vision.path).get_all("Requires-Dist") == ["torch==0.1.0+rocm5.2"]
    assert record["exact_pins"] == {"torch": "==0.1.0+rocm5.2"} and record["pins_added"] == []
    log = (root / "out" / "logs" / "torchvision.log").read_text()
    venv_torch = root / "out" / "torchvision" / "venv"
    assert "-DWITH_HIP" in log and f"-I{venv_torch}" in log and "site-packages/torch/include" in log
    # FORCE_CUDA: the GPU operators are there although this build box has no GPU.
    report = inspect.inspect_paths([vision.path], ("gfx90a",))
    (gpu,) = [f for f in report.files if f.bundles]
    assert gpu.member.endswith("torchvision/lib/libvision_hip.so") and gpu.archs == ["gfx90a"]


@pytest.mark.slow
def test_without_force_cuda_a_gpu_less_box_builds_torchvision_without_gpu_operators(tmp_path):
    """What vLLM's Dockerfile (no FORCE_CUDA, no GPU in `docker build`) gets from torchvision."""
    config = stack_config(tmp_path)
    source = "[packages.torchvision.source]"
    config.write_text(
        config.read_text().replace(source, f"[packages.torchvision.options]\nforce_cuda = false\n\n{source}")
    )
    proc = nox(config, "torchvision")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (vision,) = Wheelhouse(tmp_path / "out" / "wheelhouse").find("torchvision")
    assert "FORCE_CUDA" not in record_of(vision.path)["env"]
    assert not [f for f in inspect.inspect_paths([vision.path], ("gfx90a",)).files if f.bundles]


@pytest.mark.slow
def test_rerun_is_a_no_op(stack):
    _root, config, house, _proc = stack
    before = {e.path.name: e.path.stat().st_mtime_ns for e in house.entries()}
    start = time.monotonic()
    proc = nox(config, "pytorch", "triton", "torchvision")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(": up to date (") == 3
    assert {e.path.name: e.path.stat().st_mtime_ns for e in house.entries()} == before
    assert time.monotonic() - start < 10


def test_stack_example_pins_what_make_repos_creates(tmp_path):
    """minitorch's commit in the example, and minitriton's commit inside minitorch's tree."""
    commits = _make_repos(tmp_path)
    cfg = load_config(EXAMPLES / "stack.toml", environ={})
    assert cfg.package("pytorch").source.commit == commits["minitorch"]
    assert cfg.package("torchvision").source.commit == commits["minivision"]
    assert cfg.package("triton").source.commit is None and cfg.package("triton").pin_from == "pytorch"
    shown = subprocess.run(
        ["git", "show", f"HEAD:{PYTORCH_TRITON_COMMIT}"],
        cwd=tmp_path / "minitorch",
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == commits["minitriton"]


def test_rocm_libraries_false_lets_a_torch_without_rocblas_pass_the_doctor(tmp_path):
    """The option the example needs: off, the doctor insists on PyTorch's ROCm libraries."""
    from rocmforge import host
    from rocmforge.build.doctor import FAIL, run_checks
    from rocmforge.host import KEY_LIBRARIES, selected_rocm

    facts = host.facts()
    rocm = selected_rocm(facts)
    if rocm is None or all(rocm.libraries.get(n) for n in KEY_LIBRARIES):
        pytest.skip("needs a ROCm without the math libraries (Debian's hipcc)")
    text = (EXAMPLES / "stack.toml").read_text()
    strict = tmp_path / "strict.toml"
    strict.write_text(text.replace("rocm_libraries = false", "rocm_libraries = true"))
    for path, failed in ((EXAMPLES / "stack.toml", False), (strict, True)):
        (row,) = [
            c
            for c in run_checks(load_config(path, environ={}), facts, ["pytorch"])
            if c.name == "ROCm libraries"
        ]
        assert (row.status == FAIL) is failed and "rocblas" in row.found
