"""Fake host trees for host/doctor/buildenv tests: a ROCm under /opt, Debian's /usr layout,
KFD sysfs nodes, cgroup v1/v2 files, and tools on PATH that print recorded version banners.

Everything is written under a temp dir that stands in for ``/``; the code under test reads it
through its ``root`` and ``environ`` parameters.
"""

from __future__ import annotations

import copy
import gzip
import os
import shlex
import stat
from pathlib import Path

from rocmforge.config import parse_config, tomllib
from rocmforge.host import KEY_LIBRARIES

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = tomllib.loads((ROOT / "build_config.toml").read_text())

# Version banners as the real tools print them (gcc 13.2, clang 19, cmake 3.31, ninja, git).
BANNERS = {
    "gcc": (
        "gcc (Ubuntu 13.2.0-23ubuntu4) 13.2.0\nCopyright (C) 2023 Free Software Foundation, Inc.",
        "13.2.0",
    ),
    "clang": ("Ubuntu clang version 19.1.1 (1ubuntu1)\nTarget: x86_64-pc-linux-gnu", None),
    "cmake": (
        "cmake version 3.31.6\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).",
        None,
    ),
    "ninja": ("1.12.1", None),
    "git": ("git version 2.43.0", None),
}


def write(path: Path, text: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def tool(bindir: Path, name: str, banner: str, dumpversion: str | None = None) -> Path:
    """A shell script named ``name`` that prints ``banner`` (and gcc's -dumpfullversion)."""
    dump = (
        f'case "$1" in -dumpfullversion|-dumpversion) echo {dumpversion}; exit 0;; esac\n'
        if dumpversion
        else ""
    )
    # printf is a shell builtin: the scripts work with a PATH that holds only fake tools.
    script = f"#!/bin/sh\n{dump}printf '%s\\n' {shlex.quote(banner)}\n"
    return write(bindir / name, script, stat.S_IRWXU)


def toolchain(bindir: Path, *, gcc_names=("gcc", "g++")) -> Path:
    """Fake gcc/g++ 13, cmake 3.31, ninja, git in ``bindir``; returns bindir."""
    banner, dump = BANNERS["gcc"]
    for name in gcc_names:
        tool(bindir, name, banner, dump)
    for name in ("cmake", "ninja", "git"):
        tool(bindir, name, BANNERS[name][0])
    return bindir


def rocm(root: Path, rel: str = "opt/rocm-7.2.0", version: str = "7.2.0-43", libs=KEY_LIBRARIES) -> Path:
    """An AMD-layout ROCm: .info/version, bin/hipcc, lib/lib<name>.so for ``libs``, and the
    amdsmi Python project under share/amd_smi (what ROCm's amd-smi-lib package installs)."""
    base = root / rel
    write(base / ".info/version", version + "\n")
    tool(base / "bin", "hipcc", f"HIP version: {version}")
    for name in libs:
        write(base / "lib" / f"lib{name}.so", b"\x7fELF")
    write(base / "share/amd_smi/pyproject.toml", '[project]\nname = "amdsmi"\nversion = "26.2.1"\n')
    return base


def debian_rocm(root: Path, version: str = "5.2.3-8") -> Path:
    """Debian's packaging: hipcc in /usr/bin, libamdhip64 in /usr/lib/x86_64-linux-gnu."""
    usr = root / "usr"
    tool(usr / "bin", "hipcc", "HIP version: 5.2.21153-0")
    lib = usr / "lib/x86_64-linux-gnu"
    write(lib / "libamdhip64.so.5", b"\x7fELF")
    write(lib / "libhsa-runtime64.so.1", b"\x7fELF")
    write(usr / "include/hip/hip_version.h", "#define HIP_VERSION_MAJOR 5\n#define HIP_VERSION_MINOR 2\n")
    changelog = usr / "share/doc/hipcc/changelog.Debian.gz"
    changelog.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(changelog, "wt") as fh:
        fh.write(f"rocm-hipamd ({version}) unstable; urgency=medium\n")
    return usr


def kfd(root: Path, nodes: list[tuple[int, str | None]]) -> None:
    """KFD topology nodes in order: (gfx_target_version, product name or None); 0 = a CPU."""
    base = root / "sys/class/kfd/kfd/topology/nodes"
    for i, (target, product) in enumerate(nodes):
        lines = [f"cpu_cores_count {0 if target else 16}", f"simd_count {0 if not target else 256}"]
        lines.append(f"gfx_target_version {target}")
        if product:
            lines.append(f"drm_render_minor {128 + i}")
            write(root / f"sys/class/drm/renderD{128 + i}/device/product_name", product + "\n")
        write(base / str(i) / "properties", "\n".join(lines) + "\n")


def proc(
    root: Path, *, cpus_allowed: str = "0-63", mem_kb: int = 512 * 1024 * 1024, cgroup: str = "0::/\n"
) -> None:
    """/proc files: allowed CPUs, MemTotal and this process's cgroup membership."""
    write(root / "proc/self/status", f"Name:\tpython\nCpus_allowed_list:\t{cpus_allowed}\n")
    write(root / "proc/meminfo", f"MemTotal:       {mem_kb} kB\nMemFree:        1000 kB\n")
    write(root / "proc/self/cgroup", cgroup)


def environ(bindir: Path, **extra: str) -> dict[str, str]:
    """An environment whose PATH holds only the fake tools."""
    return {"PATH": str(bindir), "USER": "alice", "HOME": os.environ.get("HOME", "/root"), **extra}


def config(environ=None, *, packages=None, **build):
    """The shipped config with ``build`` keys (and package tables) replaced."""
    data = copy.deepcopy(DEFAULT_CONFIG)
    data["build"].update(build)
    for name, table in (packages or {}).items():
        data["packages"][name].update(table)
    return parse_config(data, path=ROOT / "build_config.toml", environ=environ or {})
