"""Doctor checks: the passing path on a fake ROCm 7.2 host, the failures users hit, this machine."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fakehost
import pytest
from fakehost import config

from rocmforge.build.doctor import FAIL, OK, WARN, require_ok, run_checks
from rocmforge.build.environment import satisfies
from rocmforge.errors import UserError
from rocmforge.host import gather

ROOT = Path(__file__).resolve().parent.parent


def healthy_host(tmp_path, **extra_env):
    """gcc 13, cmake 3.31, ROCm 7.2 with every library, an MI300X, /dev/kfd, user in video."""
    bindir = fakehost.toolchain(tmp_path / "bin")
    fakehost.proc(tmp_path, cpus_allowed="0-63", mem_kb=512 * 1024 * 1024)
    rocm = fakehost.rocm(tmp_path)
    fakehost.kfd(tmp_path, [(0, None), (90402, "AMD Instinct MI300X")])
    fakehost.write(tmp_path / "etc/group", "video:x:44:alice\nrender:x:110:alice\n")
    fakehost.write(tmp_path / "dev/kfd", "")
    env = fakehost.environ(bindir, **{"PATH": f"{rocm}/bin:{bindir}", **extra_env})
    return gather(env, root=tmp_path, build_dir=tmp_path)


def by_name(checks):
    return {c.name: c for c in checks}


def test_passing_path_on_a_fake_rocm_host(tmp_path):
    facts = healthy_host(tmp_path)
    checks = run_checks(config(), facts)
    assert [c for c in checks if c.status == FAIL] == []
    named = by_name(checks)
    assert named["ROCm version"].status == OK and "7.2.0" in named["ROCm version"].found
    assert named["pytorch: gcc >=13"].found == "gcc 13.2.0"
    assert named["vllm: cmake >=3.26.1,<4"].status == OK
    assert named["GPUs"].found == "gfx942 (AMD Instinct MI300X)"
    assert named["hipcc on PATH"].status == OK
    assert require_ok(config(), facts, ["vllm"])  # no exception: the build may start


def test_requirements_come_from_the_config(tmp_path):
    facts = healthy_host(tmp_path)
    requires = [{"tool": "gcc", "spec": "<13", "why": "made-up pin for this test"}]
    checks = by_name(run_checks(config(packages={"triton": {"requires": requires}}), facts))
    row = checks["triton: gcc <13"]
    assert (row.status, row.found) == (FAIL, "gcc 13.2.0")
    # No os-release in the fake root: the generic route, for the newest GCC the pin admits.
    assert row.fix.startswith("install GCC 12 (the distribution's gcc-12, or conda-forge's gxx=12)")
    assert row.fix.endswith("made-up pin for this test")
    with pytest.raises(UserError, match=r"triton: gcc <13: gcc 13\.2\.0") as err:
        require_ok(config(packages={"triton": {"requires": requires}}), facts, ["triton"])
    assert err.value.exit_code == 1


def test_cmake_is_checked_in_the_build_venv_not_on_the_host(tmp_path):
    """The build runs the venv's cmake (installed under the pin), whatever the host has."""
    facts = healthy_host(tmp_path)  # host cmake 3.31.6
    requires = [{"tool": "cmake", "spec": "<3.30", "why": "made-up pin for this test"}]
    cfg = config(packages={"triton": {"requires": requires}}, work_dir=str(tmp_path / "work"))
    row = by_name(run_checks(cfg, facts))["triton: cmake <3.30"]
    assert (row.status, row.found) == (
        OK,
        "pip 'cmake<3.30' into the build venv (host cmake 3.31.6: not used)",
    )
    # Once the venv exists, its cmake is the one asked.
    venv_cmake = fakehost.tool(tmp_path / "work/triton/venv/bin", "cmake", "cmake version 3.29.9")
    row = by_name(run_checks(cfg, facts))["triton: cmake <3.30"]
    assert (row.status, row.found) == (OK, f"cmake 3.29.9 in the build venv ({venv_cmake})")
    # A venv made before the pin (cmake 4) is remade under it, so the pin is what counts.
    fakehost.tool(tmp_path / "work/triton/venv/bin", "cmake", "cmake version 4.1.0")
    row = by_name(run_checks(cfg, facts))["triton: cmake <3.30"]
    assert row.found.startswith("pip 'cmake<3.30' into the build venv")


def test_common_failures(tmp_path):
    facts = healthy_host(tmp_path)
    old = fakehost.rocm(tmp_path, "opt/rocm-6.4.1", "6.4.1-120", libs=("amdhip64",))
    # hipcc of another ROCm first on PATH, an arch list without this machine's GPU, too many jobs.
    mixed = gather(
        {
            **facts.environ,
            "PATH": f"{old}/bin:{facts.environ['PATH']}",
            "ROCM_PATH": str(tmp_path / "opt/rocm-7.2.0"),
        },
        root=tmp_path,
        build_dir=tmp_path,
    )
    rows = run_checks(config({"PYTORCH_ROCM_ARCH": "gfx90a", "MAX_JOBS": "200"}), mixed)
    checks = by_name(rows)
    assert checks["hipcc on PATH"].status == WARN and "two ROCm installs mixed" in checks["hipcc on PATH"].fix
    assert checks["ROCm installs"].status == WARN and "6.4.1" in checks["ROCm installs"].found
    assert checks["GPUs"].status == WARN and "hipErrorNoBinaryForGpu" in checks["GPUs"].fix
    assert checks["memory"].status == WARN and "MAX_JOBS=128" in checks["memory"].fix
    overrides = [c.found for c in rows if c.name == "config"]
    assert overrides == [
        "PYTORCH_ROCM_ARCH='gfx90a' overrides build.arch",
        "MAX_JOBS='200' overrides build.jobs",
    ]

    # The older ROCm alone: too old for the pins and missing PyTorch's libraries.
    only_old = gather({**mixed.environ, "ROCM_PATH": str(old)}, root=tmp_path, build_dir=tmp_path)
    checks = by_name(run_checks(config(), only_old))
    assert checks["ROCm version"].status == FAIL
    assert checks["ROCm version"].found.startswith("no ROCm 7.2: found ROCm 6.4.1")
    assert checks["ROCm libraries"].status == FAIL and "rocblas" in checks["ROCm libraries"].found
    assert checks["pytorch: rocm >=7.2"].status == FAIL

    # A ROCM_PATH that does not exist, a device node we may not open (recorded facts).
    gone = gather({**facts.environ, "ROCM_PATH": str(tmp_path / "nope")}, root=tmp_path, build_dir=tmp_path)
    assert (
        by_name(run_checks(config(), gone))["ROCm"].found == f"ROCM_PATH={tmp_path / 'nope'} does not exist"
    )
    denied = by_name(run_checks(config(), dataclasses.replace(facts, kfd="denied")))["/dev/kfd"]
    assert denied.status == FAIL and "usermod -aG video,render" in denied.fix


def test_conda_shadowing_an_older_libstdcxx_fails(tmp_path):
    prefix = tmp_path / "conda"
    fakehost.write(prefix / "lib/libstdc++.so.6", b"GLIBCXX_3.4.29\0")
    fakehost.write(tmp_path / "usr/lib/x86_64-linux-gnu/libstdc++.so.6", b"GLIBCXX_3.4.32\0")
    facts = healthy_host(tmp_path, CONDA_PREFIX=str(prefix), LD_LIBRARY_PATH=str(prefix / "lib"))
    row = by_name(run_checks(config(), facts))["conda libstdc++"]
    assert row.status == FAIL and "GLIBCXX 3.4.29; system 3.4.32" in row.found
    assert "conda deactivate" in row.fix


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_other_backends_skip_rocm_checks(tmp_path, backend):
    cuda = tmp_path / "cuda"
    fakehost.tool(cuda / "bin", "nvcc", "Cuda compilation tools, release 12.8, V12.8.93")
    bindir = fakehost.toolchain(tmp_path / "bin")
    fakehost.proc(tmp_path, cpus_allowed="0-15", mem_kb=64 * 1024 * 1024)
    env = fakehost.environ(bindir, PATH=f"{cuda}/bin:{bindir}", CUDA_HOME=str(cuda))
    facts = gather(env, root=tmp_path, build_dir=tmp_path)  # no ROCm, no GPU, no /dev/kfd
    checks = run_checks(config(backend=backend, arch=[]), facts)
    names = {c.name for c in checks}
    assert not {"ROCm", "ROCm version", "ROCm libraries", "GPUs", "/dev/kfd", "pytorch: rocm >=7.2"} & names
    assert [c for c in checks if c.status == FAIL] == []
    assert ("CUDA" in names) == (backend == "cuda")


def test_this_machine_gets_a_clear_verdict():
    facts = gather()
    checks = run_checks(config(), facts)
    rocm_rows = [c for c in checks if c.name.startswith("ROCm") and c.status == FAIL]
    if not any(satisfies(i.version, ">=7.2") for i in facts.rocm_installs):
        assert rocm_rows and "no ROCm" in rocm_rows[0].found
        with pytest.raises(UserError, match="not ready to build"):
            require_ok(config(), facts, None)


def test_cli_json_and_nox_session_finish_in_seconds():
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge", "doctor", "--json"], capture_output=True, text=True, cwd=ROOT
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == (0 if doc["ok"] else 1)
    assert {c["status"] for c in doc["checks"]} <= {OK, WARN, FAIL}
    assert doc["facts"]["cpus"] >= 1
    # In a log (no terminal) the verdict is the last line, whole, naming what to run after the fixes.
    text = subprocess.run(
        [sys.executable, "-m", "rocmforge", "doctor"], capture_output=True, text=True, cwd=ROOT
    )
    if not doc["ok"]:
        assert text.stderr.splitlines()[-1] == doc["verdict"]
        assert doc["verdict"].endswith("then check again with `python -m rocmforge doctor`")

    start = time.monotonic()
    nox = subprocess.run(
        [sys.executable, "-m", "nox", "-s", "toolchain"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("PYTORCH_ROCM_ARCH", "MAX_JOBS")},
    )
    elapsed = time.monotonic() - start
    assert elapsed < 10
    assert "rocmforge doctor" in nox.stderr + nox.stdout
    assert (nox.returncode == 0) == doc["ok"]
    if not doc["ok"]:
        assert "not ready to build" in nox.stderr + nox.stdout


def test_rocm_path_without_a_rocm_version(tmp_path):
    # It read "found ROCm ? at ..., older than the pinned 7.2": no version is no ROCm, not an old one.
    empty = tmp_path / "not rocm"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge", "doctor", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ROCM_PATH": str(empty)},
    )
    assert proc.returncode == 1
    row = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["ROCm version"]
    assert (row["status"], row["found"]) == (
        FAIL,
        f"no ROCm 7.2: {empty} (ROCM_PATH) has no ROCm version; not a ROCm install",
    )


# os-release of each distribution the install hints know, as the real files spell it.
OS_RELEASES = {
    "debian-12": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
    "ubuntu-22.04": 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n',
    "ubuntu-24.04": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n',
    "rhel-9": 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.5"\n',
}


@pytest.mark.parametrize(
    ("os_id", "gcc13_route"),
    [
        # Debian 12 has no gcc-13 package: "install gcc-13 g++-13 (apt)" could not be followed.
        ("debian-12", "micromamba create -p ~/gcc-13 -c conda-forge gxx=13"),
        ("ubuntu-22.04", "add-apt-repository ppa:ubuntu-toolchain-r/test && sudo apt-get install gcc-13"),
        ("ubuntu-24.04", "sudo apt-get install gcc-13 g++-13"),
        ("rhel-9", "sudo dnf install gcc-toolset-13, then `source /opt/rh/gcc-toolset-13/enable`"),
    ],
)
def test_fixes_name_the_route_of_this_distribution(tmp_path, monkeypatch, os_id, gcc13_route):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a user, who needs sudo
    bindir = fakehost.toolchain(tmp_path / "bin")
    fakehost.tool(bindir, "gcc", "gcc (Debian 12.2.0-14) 12.2.0", "12.2.0")
    fakehost.tool(bindir, "g++", "g++ (Debian 12.2.0-14) 12.2.0", "12.2.0")
    fakehost.tool(bindir, "cmake", "cmake version 3.25.1")
    fakehost.write(tmp_path / "etc/os-release", OS_RELEASES[os_id])
    facts = gather(fakehost.environ(bindir), root=tmp_path, build_dir=tmp_path)
    assert facts.os_id == os_id
    checks = by_name(run_checks(config(), facts))
    assert gcc13_route in checks["pytorch: gcc >=13"].fix
    assert checks["pytorch: gcc >=13"].fix.count("__truncsfbf2") == 1  # the reason, said once
    with pytest.raises(UserError) as err:
        require_ok(config(), facts, ["pytorch"])
    assert str(err.value).endswith("then check again with `nox -s toolchain`")


def test_every_requirement_tool_has_a_hint_for_every_distribution():
    from rocmforge.config import REQUIREMENT_TOOLS
    from rocmforge.hints import install_hint

    for tool in (*REQUIREMENT_TOOLS, "ccache", "sccache"):
        for os_id in (*OS_RELEASES, "arch-rolling"):
            for root in (True, False):
                hint = install_hint(tool, os_id, spec=">=13", root=root)
                assert hint and "{" not in hint and not hint.startswith("install " + tool + " >=13")
                assert ("sudo" in hint) <= (not root)


def test_amds_pip_sdk_is_named_with_a_warning_never_suggested(tmp_path):
    """TheRock's rocm[devel] layout is untested here (PyPI's `rocm` is a placeholder): the
    doctor says so instead of recommending it."""
    bindir = fakehost.toolchain(tmp_path / "bin")
    fakehost.proc(tmp_path)
    site = tmp_path / "venv/lib/python3.12/site-packages"
    fakehost.write(site / "_rocm_sdk_devel/.info/version", "7.10.0\n")
    fakehost.write(site / "rocm_sdk_core-7.10.0.dist-info/METADATA", "Name: rocm-sdk-core\n")
    facts = gather(fakehost.environ(bindir, VIRTUAL_ENV=str(tmp_path / "venv")), root=tmp_path)
    checks = run_checks(config(), facts)
    layout = by_name(checks)["ROCm layout"]
    assert layout.status == WARN and "pip SDK" in layout.found and "amdgpu-install" in layout.fix
    assert not [c for c in checks if "rocm[" in f"{c.fix}"]
