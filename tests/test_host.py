"""Host facts from fake trees (cgroups, ROCm layouts, conda) and from this real machine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import fakehost
import pytest

from rocmforge import host
from rocmforge.host import (
    HostFacts,
    find_rocm_installs,
    gather,
    probe_conda,
    probe_cpus,
    probe_memory,
    selected_rocm,
)

GIB = 1 << 30


def test_cgroup_v2_quota_caps_cpus_and_memory(tmp_path):
    fakehost.proc(tmp_path, cpus_allowed="0-31", mem_kb=256 * 1024 * 1024, cgroup="0::/build.slice/job\n")
    cg = tmp_path / "sys/fs/cgroup"
    fakehost.write(cg / "cpu.max", "max 100000\n")
    fakehost.write(cg / "build.slice/cpu.max", "800000 100000\n")  # the parent's 8 CPUs apply
    fakehost.write(cg / "build.slice/job/cpu.max", "max 100000\n")
    fakehost.write(cg / "build.slice/job/memory.max", str(48 * GIB) + "\n")
    assert probe_cpus(tmp_path) == (8, 32, 8.0)
    assert probe_memory(tmp_path) == (48 * GIB, 256 * GIB, 48 * GIB)


def test_cgroup_v1_quota_and_limit(tmp_path):
    fakehost.proc(
        tmp_path,
        cpus_allowed="0-3,8-11",
        mem_kb=64 * 1024 * 1024,
        cgroup="4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
    )
    cg = tmp_path / "sys/fs/cgroup"
    fakehost.write(cg / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n")
    fakehost.write(cg / "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    fakehost.write(cg / "memory/memory.limit_in_bytes", "9223372036854771712\n")  # "no limit"
    fakehost.write(cg / "memory/docker/abc/memory.limit_in_bytes", str(12 * GIB) + "\n")
    assert probe_cpus(tmp_path) == (2, 8, 2.5)
    assert probe_memory(tmp_path) == (12 * GIB, 64 * GIB, 12 * GIB)


def test_no_cgroup_limits(tmp_path):
    fakehost.proc(tmp_path, cpus_allowed="0-15", mem_kb=32 * 1024 * 1024)
    fakehost.write(tmp_path / "sys/fs/cgroup/cpu.max", "max 100000\n")
    fakehost.write(tmp_path / "sys/fs/cgroup/memory.max", "max\n")
    assert probe_cpus(tmp_path) == (16, 16, None)
    assert probe_memory(tmp_path) == (32 * GIB, 32 * GIB, None)


def test_several_rocm_installs_in_preference_order(tmp_path):
    fakehost.rocm(tmp_path, "opt/rocm-6.4.1", "6.4.1-120")
    newest = fakehost.rocm(tmp_path, "opt/rocm-7.2.0", "7.2.0-43")
    (tmp_path / "opt/rocm").symlink_to(newest)
    custom = fakehost.rocm(tmp_path, "home/alice/rocm-dev", "7.3.0-1", libs=("amdhip64",))
    fakehost.debian_rocm(tmp_path)
    site = tmp_path / "venv/lib/python3.12/site-packages"
    fakehost.write(site / "_rocm_sdk_devel/bin/.keep", "")
    fakehost.write(site / "rocm_sdk_core-7.10.0.dist-info/METADATA", "Name: rocm-sdk-core\n")

    installs = find_rocm_installs(tmp_path, {"ROCM_PATH": str(custom), "VIRTUAL_ENV": str(tmp_path / "venv")})
    summary = [(Path(i.root).relative_to(tmp_path).as_posix(), i.version, i.kind, i.origin) for i in installs]
    assert summary == [
        ("home/alice/rocm-dev", "7.3.0", "env", "ROCM_PATH"),
        ("opt/rocm", "7.2.0", "opt", "/opt/rocm, /opt/rocm-*"),  # the symlink and its target are one
        ("opt/rocm-6.4.1", "6.4.1", "opt", "/opt/rocm-*"),
        ("venv/lib/python3.12/site-packages/_rocm_sdk_devel", "7.10.0", "pip", f"pip rocm_sdk in {site}"),
        ("usr", "5.2.3", "distro", "distro packages"),
    ]
    assert installs[0].libraries["amdhip64"] and installs[0].libraries["rocblas"] is None
    assert installs[1].hipcc == str(tmp_path / "opt/rocm/bin/hipcc")

    # Without ROCM_PATH the /opt/rocm symlink wins; a ROCM_PATH that does not exist is left out.
    assert find_rocm_installs(tmp_path, {"ROCM_PATH": str(tmp_path / "nope")})[0].version == "7.2.0"


def test_debian_usr_layout(tmp_path):
    fakehost.debian_rocm(tmp_path)
    (inst,) = find_rocm_installs(tmp_path, {})
    assert (inst.version, inst.kind, inst.lib_dir) == (
        "5.2.3",
        "distro",
        str(tmp_path / "usr/lib/x86_64-linux-gnu"),
    )
    assert inst.libraries["amdhip64"].endswith("libamdhip64.so.5")
    assert inst.libraries["MIOpen"] is None


@pytest.mark.skipif(not Path("/usr/bin/hipcc").exists(), reason="Debian's hipcc is not installed")
def test_this_machines_debian_hipcc_is_found():
    facts = gather()
    rocm = next(i for i in facts.rocm_installs if i.kind == "distro")
    assert rocm.root == "/usr" and rocm.version.startswith("5.2")
    assert rocm.libraries["amdhip64"]


def test_conda_libstdcxx_shadowing(tmp_path):
    prefix = tmp_path / "conda/envs/build"
    fakehost.write(prefix / "lib/libstdc++.so.6", b"\x7fELF GLIBCXX_3.4.28\0GLIBCXX_3.4.29\0")
    fakehost.write(tmp_path / "usr/lib/x86_64-linux-gnu/libstdc++.so.6", b"GLIBCXX_3.4.29\0GLIBCXX_3.4.32\0")
    shadowing = {"CONDA_PREFIX": str(prefix), "LD_LIBRARY_PATH": f"{prefix}/lib:/usr/lib"}
    assert probe_conda(tmp_path, shadowing) == (
        str(prefix),
        str(prefix / "lib/libstdc++.so.6"),
        "3.4.29",
        "3.4.32",
        True,
    )
    # A conda python first on PATH loads conda's lib through its RPATH, too.
    fakehost.tool(prefix / "bin", "python", "Python 3.11")
    assert probe_conda(tmp_path, {"CONDA_PREFIX": str(prefix), "PATH": str(prefix / "bin")})[4] is True
    assert probe_conda(tmp_path, {"CONDA_PREFIX": str(prefix), "PATH": "/usr/bin"})[4] is False
    assert probe_conda(tmp_path, {})[:3] == (None, None, None)


def test_gather_on_a_fake_host_and_json_round_trip(tmp_path):
    bindir = fakehost.toolchain(tmp_path / "bin", gcc_names=("gcc", "g++", "gcc-13", "g++-13"))
    fakehost.tool(bindir, "clang-19", fakehost.BANNERS["clang"][0])
    fakehost.proc(tmp_path, cpus_allowed="0-7", mem_kb=32 * 1024 * 1024)
    fakehost.rocm(tmp_path)
    fakehost.kfd(tmp_path, [(0, None), (90402, "AMD Instinct MI300X")])
    fakehost.write(tmp_path / "etc/group", "video:x:44:alice\nrender:x:110:\n")
    fakehost.write(tmp_path / "dev/kfd", "")
    env = fakehost.environ(bindir, CC="gcc-13")
    facts = gather(env, root=tmp_path, build_dir=tmp_path / "build")
    assert facts.compilers == {
        "clang-19": "19.1.1",
        "g++": "13.2.0",
        "g++-13": "13.2.0",
        "gcc": "13.2.0",
        "gcc-13": "13.2.0",
    }
    assert facts.tools == {"cmake": "3.31.6", "ninja": "1.12.1", "git": "2.43.0", "nvcc": None}
    assert (facts.cc, facts.cc_version) == ("gcc-13", "13.2.0")
    assert (facts.cpus, facts.mem_bytes) == (8, 32 * GIB)
    assert selected_rocm(facts).version == "7.2.0"
    assert facts.libraries["hipblaslt"]
    assert [(g.arch, g.name) for g in facts.gpus] == [("gfx942", "AMD Instinct MI300X")]
    assert facts.groups == ("video",) and facts.kfd == "ok" and facts.dri == "absent"
    assert facts.disk_path == str(tmp_path)
    assert facts.first_hipcc is None  # ROCm's bin is not on this PATH
    again = HostFacts.from_json(json.loads(json.dumps(facts.to_json())))
    assert again == facts


def test_gather_on_this_machine_is_fast_and_consistent():
    import time

    start = time.monotonic()
    facts = gather()
    assert time.monotonic() - start < 5
    assert 1 <= facts.cpus <= (os.cpu_count() or 1)
    assert facts.mem_bytes > 0
    if shutil.which("gcc"):
        assert facts.compilers["gcc"][0].isdigit()
    assert facts.first_hipcc == shutil.which("hipcc")
    assert host.HostFacts.from_json(facts.to_json()) == facts


def test_facts_are_gathered_once_per_process(tmp_path):
    # One nox run: the toolchain session, every package session and the lock share one gather.
    first = host.facts(tmp_path)
    assert host.facts(tmp_path) is first
    assert host.facts(str(tmp_path)) is first
    elsewhere = host.facts(tmp_path / "other-disk")
    assert elsewhere is not first and elsewhere.disk_path == str(tmp_path)
