"""Host facts, gathered once at the edge into plain values that everything downstream reads.

:func:`gather` looks at the machine (CPUs, memory, disk, compilers, tools, ROCm installs, GPUs,
permissions, conda) and returns a frozen :class:`HostFacts`. Doctor checks and the build
environment are pure functions of those facts, so tests feed them recorded or fake facts.

Every probe takes ``root`` (the filesystem root it reads: ``/`` for real, a temp dir in tests
with a fake ``/opt/rocm``, sysfs or cgroup tree) and ``environ`` (``os.environ`` for real).
Version probes run tools with argument lists, in parallel, each with a short timeout, so the
whole gather takes well under a second on a normal machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import gzip
import os
import platform
import re
import shlex
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmforge.arch_detect import Gpu, read_kfd_topology

# The ROCm libraries a PyTorch/vLLM build links against; the doctor checks each one.
KEY_LIBRARIES = ("amdhip64", "hsa-runtime64", "rocblas", "hipblas", "hipblaslt", "MIOpen", "rccl")
# Environment variables a build reads; recorded so build environments are pure functions.
ENV_KEYS = (
    "PATH",
    "LD_LIBRARY_PATH",
    "CMAKE_PREFIX_PATH",
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "ROCM_PATH",
    "ROCM_HOME",
    "HIP_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
)
_COMPILER_RE = re.compile(r"^(?:gcc|g\+\+|clang|clang\+\+)(?:-\d+)?$")
_TOOL_TIMEOUT_S = 10
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63


@dataclass(frozen=True)
class RocmInstall:
    """One ROCm found on the host. ``kind``: env, opt, distro (Debian's /usr) or pip (rocm_sdk)."""

    root: str
    version: str | None
    kind: str
    origin: str  # how it was found: "ROCM_PATH", "/opt/rocm", "distro packages", ...
    hipcc: str | None
    lib_dir: str | None
    libraries: dict[str, str | None] = field(default_factory=dict)  # name -> .so path


@dataclass(frozen=True)
class HostFacts:
    """Everything the doctor and the build environment need to know about this host."""

    cpus: int  # usable for compiling: affinity, capped by the cgroup CPU quota
    cpus_online: int
    cpu_quota: float | None  # cgroup quota in CPUs, None = unlimited
    mem_bytes: int  # usable: physical memory capped by the cgroup limit
    mem_total_bytes: int
    mem_limit_bytes: int | None  # cgroup memory limit, None = unlimited
    disk_path: str
    disk_free_bytes: int | None
    os: str
    kernel: str
    python: str
    compilers: dict[str, str]  # command on PATH -> version: gcc, g++-13, clang-19, ...
    cc: str | None  # $CC / $CXX as set, with their versions below
    cxx: str | None
    cc_version: str | None
    cxx_version: str | None
    tools: dict[str, str | None]  # cmake, ninja, git, nvcc -> version (None = not found)
    ccache: str | None
    sccache: str | None
    rocm_installs: tuple[RocmInstall, ...]
    first_hipcc: str | None  # the hipcc a shell would run
    gpus: tuple[Gpu, ...]
    user: str
    groups: tuple[str, ...]
    kfd: str  # ok | denied | absent
    dri: str  # ok | denied | absent
    device_groups: tuple[str, ...]  # groups owning /dev/kfd and /dev/dri/renderD*
    conda_prefix: str | None
    conda_libstdcxx: str | None
    conda_glibcxx: str | None  # newest GLIBCXX_ version in conda's libstdc++
    system_glibcxx: str | None
    conda_shadows: bool  # conda's lib dir comes before the system's for builds
    cuda_home: str | None
    environ: dict[str, str]  # the ENV_KEYS that were set
    os_id: str = ""  # "debian-12", "ubuntu-22.04", "rhel-9", ...: picks the install hints

    @property
    def libraries(self) -> dict[str, str | None]:
        """Key libraries of the ROCm a build would use (see :func:`selected_rocm`)."""
        rocm = selected_rocm(self)
        return dict(rocm.libraries) if rocm else {}

    @property
    def rocm_version(self) -> str | None:
        """Version of the ROCm a build would use (see :func:`selected_rocm`), if known."""
        rocm = selected_rocm(self)
        return rocm.version if rocm else None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able data; :meth:`from_json` reads it back (recorded facts in tests)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostFacts:
        """Rebuild facts saved with :meth:`to_json`."""
        values = dict(data)
        values["rocm_installs"] = tuple(RocmInstall(**r) for r in values["rocm_installs"])
        values["gpus"] = tuple(Gpu(**g) for g in values["gpus"])
        for key in ("groups", "device_groups"):
            values[key] = tuple(values[key])
        return cls(**values)


@functools.lru_cache(maxsize=8)
def interpreter_version(exe: str) -> str | None:
    """``platform.python_version()`` of the interpreter ``exe``; None when it does not run as one.

    Cached: a build asks for it per package (fingerprint and record). Callers word the error,
    since only they know which setting named ``exe``.
    """
    try:
        out = subprocess.run(
            [exe, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def selected_rocm(facts: HostFacts) -> RocmInstall | None:
    """The ROCm a build uses: ROCM_PATH, then HIP_PATH, /opt/rocm, newest /opt/rocm-*, pip, /usr.

    :func:`find_rocm_installs` already lists installs in that order of preference.
    """
    return facts.rocm_installs[0] if facts.rocm_installs else None


def install_of(facts: HostFacts, path: str | None) -> RocmInstall | None:
    """The ROCm install a file (e.g. the first hipcc on PATH) belongs to."""
    if not path:
        return None
    real = os.path.realpath(path)
    for inst in facts.rocm_installs:
        if inst.hipcc and os.path.realpath(inst.hipcc) == real:
            return inst
        if inst.kind != "distro" and real.startswith(os.path.realpath(inst.root) + os.sep):
            return inst
    return None


# --- CPUs and memory -------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _cgroup_paths(root: Path) -> dict[str, str]:
    """controller -> this process's cgroup path ("" is the cgroup v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _cgroup_values(root: Path, controller: str, filename: str) -> list[str]:
    """Contents of ``filename`` in this process's cgroup and every ancestor (all apply).

    Inside a container with its own cgroup namespace the process path may not exist under
    the mount; the mount's own top directory is then the container's cgroup.
    """
    base = root / "sys/fs/cgroup"
    paths = _cgroup_paths(root)
    if controller in paths and (base / controller).is_dir():
        bases, rel = [base / controller], paths[controller]
    elif controller in paths and (base / "cpu,cpuacct").is_dir() and controller in ("cpu", "cpuacct"):
        bases, rel = [base / "cpu,cpuacct"], paths[controller]
    else:
        bases, rel = [base], paths.get("", "/")
    values: list[str] = []
    for b in bases:
        parts = [p for p in rel.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            text = _read(b.joinpath(*parts[:depth], filename))
            if text is not None:
                values.append(text.strip())
    return values


def probe_cpus(root: Path | str = "/") -> tuple[int, int, float | None]:
    """(usable CPUs, online CPUs, cgroup quota in CPUs or None).

    Usable = the CPUs this process may run on (``Cpus_allowed_list``), capped by the cgroup
    CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), at least 1.
    """
    root = Path(root)
    status = _read(root / "proc/self/status") or ""
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)
    allowed = _count_cpu_list(m.group(1)) if m else None
    if allowed is None:
        allowed = len(os.sched_getaffinity(0)) if str(root) == "/" else (os.cpu_count() or 1)
    online = _count_cpu_list((_read(root / "sys/devices/system/cpu/online") or "").strip()) or allowed
    quotas: list[float] = []
    for text in _cgroup_values(root, "", "cpu.max"):
        fields = text.split()
        if len(fields) == 2 and fields[0] != "max":
            quotas.append(int(fields[0]) / int(fields[1]))
    for quota, period in zip(
        _cgroup_values(root, "cpu", "cpu.cfs_quota_us"),
        _cgroup_values(root, "cpu", "cpu.cfs_period_us"),
        strict=False,
    ):
        if quota.lstrip("-").isdigit() and int(quota) > 0 and period.isdigit():
            quotas.append(int(quota) / int(period))
    quota = min(quotas) if quotas else None
    usable = allowed if quota is None else max(1, min(allowed, int(quota)))
    return usable, online, quota


def _count_cpu_list(text: str) -> int | None:
    """``0-3,8,10-11`` -> 7."""
    if not text:
        return None
    total = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        total += int(hi or lo) - int(lo) + 1
    return total


def probe_memory(root: Path | str = "/") -> tuple[int, int, int | None]:
    """(usable bytes, physical bytes, cgroup limit or None): v2 ``memory.max``, v1 limit_in_bytes."""
    root = Path(root)
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read(root / "proc/meminfo") or "", re.MULTILINE)
    total = int(m.group(1)) * 1024 if m else 0
    limits = [
        int(v)
        for v in (
            *_cgroup_values(root, "", "memory.max"),
            *_cgroup_values(root, "memory", "memory.limit_in_bytes"),
        )
        if v.isdigit() and int(v) < _NO_LIMIT
    ]
    limit = min(limits) if limits else None
    usable = min(x for x in (total, limit) if x) if (total or limit) else 0
    return usable, total, limit


def probe_disk(path: Path | str) -> tuple[str, int | None]:
    """(existing directory measured, free bytes) for where builds go (may not exist yet)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return str(p), shutil.disk_usage(p).free
    except OSError:
        return str(p), None


def probe_os(root: Path | str = "/") -> tuple[str, str]:
    """(distribution name from os-release, kernel release)."""
    root = Path(root)
    text = _read(root / "etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.MULTILINE)
    kernel = (_read(root / "proc/sys/kernel/osrelease") or "").strip()
    if not kernel and str(root) == "/":
        kernel = platform.release()
    return (m.group(1) if m else platform.system()), kernel


def probe_os_id(root: Path | str = "/") -> str:
    """``debian-12``, ``ubuntu-22.04``, ``rhel-9`` (Rocky and Alma too), ... from os-release."""
    text = _read(Path(root) / "etc/os-release") or ""
    fields = dict(re.findall(r'^(\w+)="?([^"\n]*)"?', text, re.MULTILINE))
    os_id, version = fields.get("ID", "").lower(), fields.get("VERSION_ID", "")
    if os_id == "rhel" or "rhel" in fields.get("ID_LIKE", "").split():
        return f"rhel-{version.split('.')[0]}"
    if os_id == "debian":
        return f"debian-{version.split('.')[0]}"
    return f"{os_id}-{version}" if os_id else ""


# --- compilers and tools --------------------------------------------------------------------
def _run_version(argv: list[str], pattern: str, environ: Mapping[str, str]) -> str | None:
    """First group of ``pattern`` in the output of ``argv`` (None if it fails or times out)."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_TOOL_TIMEOUT_S,
            env={**environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(pattern, proc.stdout + proc.stderr)
    return m.group(1) if m else None


def tool_version(exe: str, tool: str, environ: Mapping[str, str]) -> str | None:
    """The version ``exe`` reports, read as ``TOOL_VERSIONS[tool]`` reads it (None when it fails)."""
    args, pattern = TOOL_VERSIONS[tool]
    return _run_version([exe, *args], pattern, environ)


def compiler_version(exe: str, environ: Mapping[str, str]) -> str | None:
    """Version of a C/C++ compiler: gcc's ``-dumpfullversion``, clang's ``--version`` banner."""
    out = _run_version([exe, "--version"], r"(?s)(.*)", environ) or ""
    m = re.search(r"clang version (\d+\.\d+(?:\.\d+)?)", out)
    if m:
        return m.group(1)
    if re.search(r"\b(?:gcc|g\+\+|GCC)\b|Free Software Foundation", out):
        return _run_version([exe, "-dumpfullversion", "-dumpversion"], r"(\d+(?:\.\d+)*)", environ)
    return None


TOOL_VERSIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "cmake": (("--version",), r"cmake version (\d+\.\d+(?:\.\d+)?)"),
    "ninja": (("--version",), r"(\d+\.\d+(?:\.\d+)?)"),
    "git": (("--version",), r"git version (\d+\.\d+(?:\.\d+)?)"),
    "nvcc": (("--version",), r"release \d+\.\d+, V(\d+\.\d+(?:\.\d+)?)"),
}


def _path_dirs(environ: Mapping[str, str]) -> list[str]:
    return [d for d in environ.get("PATH", os.defpath).split(os.pathsep) if d]


def find_compilers(environ: Mapping[str, str]) -> dict[str, str]:
    """Compiler commands on PATH (gcc, g++, gcc-13, clang-19, ...) -> their paths; first wins."""
    found: dict[str, str] = {}
    for d in _path_dirs(environ):
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(d)):
                if _COMPILER_RE.match(entry) and entry not in found:
                    path = os.path.join(d, entry)
                    if os.access(path, os.X_OK) and not os.path.isdir(path):
                        found[entry] = path
    return found


def _compiler_exe(value: str | None, environ: Mapping[str, str]) -> str | None:
    """The compiler named by $CC/$CXX ("ccache gcc-13" -> the gcc-13 on PATH)."""
    if not value:
        return None
    words = [w for w in shlex.split(value) if os.path.basename(w) not in ("ccache", "sccache")]
    return shutil.which(words[0], path=environ.get("PATH", os.defpath)) if words else None


# --- ROCm installs --------------------------------------------------------------------------
def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:4])


def rocm_version(root: Path, kind: str) -> str | None:
    """The ROCm version of an install, from the files each layout keeps it in."""
    info = _read(root / ".info/version")
    if info and re.match(r"\d+\.\d+", info.strip()):
        return re.match(r"\d+\.\d+(?:\.\d+)?", info.strip()).group(0)
    header = _read(root / "include/rocm-core/rocm_version.h") or ""
    parts = [re.search(rf"#define ROCM_VERSION_{p}\s+(\d+)", header) for p in ("MAJOR", "MINOR", "PATCH")]
    if all(parts):
        return ".".join(m.group(1) for m in parts)
    m = re.search(r"rocm-(\d+\.\d+(?:\.\d+)?)", root.name)
    if m:
        return m.group(1)
    if kind == "distro":
        # Debian's changelog names the ROCm release ("rocm-hipamd (5.2.3-8)"); hip_version.h
        # only has major.minor plus a build number.
        for doc in ("hipcc", "libamdhip64-dev", "libamdhip64-5"):
            with contextlib.suppress(OSError, EOFError):
                with gzip.open(root / "share/doc" / doc / "changelog.Debian.gz", "rt") as fh:
                    m = re.match(r"\S+ \((\d+\.\d+(?:\.\d+)?)", fh.readline())
                if m:
                    return m.group(1)
    hip = _read(root / "include/hip/hip_version.h") or ""
    major = re.search(r"#define HIP_VERSION_MAJOR\s+(\d+)", hip)
    minor = re.search(r"#define HIP_VERSION_MINOR\s+(\d+)", hip)
    return f"{major.group(1)}.{minor.group(1)}" if major and minor else None


def _lib_dir(root: Path, kind: str) -> Path | None:
    candidates = sorted(root.glob("lib/*-linux-gnu")) if kind == "distro" else [root / "lib", root / "lib64"]
    return next((d for d in candidates if d.is_dir()), None)


def _make_install(root: Path, kind: str, origin: str, version: str | None = None) -> RocmInstall:
    lib_dir = _lib_dir(root, kind)
    # One listing for all the key libraries: Debian's /usr/lib/<triplet> holds thousands of
    # files, and a glob per library read it once each.
    try:
        files = sorted(os.listdir(lib_dir)) if lib_dir else []
    except OSError:
        files = []
    libraries: dict[str, str | None] = {}
    for name in KEY_LIBRARIES:
        prefix = f"lib{name}.so"
        hit = next((f for f in files if f.startswith(prefix)), None)
        libraries[name] = str(lib_dir / hit) if hit else None
    hipcc = root / "bin/hipcc"
    return RocmInstall(
        root=str(root),
        version=version or rocm_version(root, kind),
        kind=kind,
        origin=origin,
        hipcc=str(hipcc) if hipcc.exists() else None,
        lib_dir=str(lib_dir) if lib_dir else None,
        libraries=libraries,
    )


def _site_dirs(root: Path, environ: Mapping[str, str]) -> list[Path]:
    """site-packages of the active venv/conda env, and of this interpreter on the real host."""
    dirs: list[Path] = []
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if environ.get(var):
            dirs += sorted(Path(environ[var]).glob("lib/python3*/site-packages"))
    if str(root) == "/":
        dirs += [Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")]
    return list(dict.fromkeys(dirs))


def _pip_sdk(site: Path) -> tuple[Path, str | None] | None:
    """AMD's pip SDK (``rocm[devel]``): ``_rocm_sdk_devel`` is the ROCm root after ``rocm-sdk init``."""
    for name in ("_rocm_sdk_devel", "_rocm_sdk_core"):
        if (site / name).is_dir():
            dist = sorted(site.glob("rocm_sdk_core-*.dist-info")) or sorted(site.glob("rocm-*.dist-info"))
            m = re.search(r"-(\d+\.\d+(?:\.\d+)?)", dist[-1].name) if dist else None
            return site / name, (m.group(1) if m else None)
    return None


def find_rocm_installs(root: Path | str = "/", environ: Mapping[str, str] | None = None) -> list[RocmInstall]:
    """Every ROCm on the host, in the order a build would prefer them; duplicates folded.

    ROCM_PATH and HIP_PATH come first (a ROCM_PATH that does not exist is left out; the
    doctor reports it), then /opt/rocm, /opt/rocm-X.Y.Z newest first, AMD's pip SDK in the
    active environment, and distro packages under /usr (Debian ships hipcc in /usr/bin and
    libamdhip64 in /usr/lib/<triplet>).
    """
    root = Path(root)
    environ = os.environ if environ is None else environ
    candidates: list[tuple[Path, str, str, str | None]] = []
    for var in ("ROCM_PATH", "HIP_PATH"):
        if environ.get(var):
            p = Path(environ[var])
            if p.is_dir():
                candidates.append(
                    (p, "distro" if p.resolve() == (root / "usr").resolve() else "env", var, None)
                )
    opt = root / "opt"
    if (opt / "rocm").is_dir():
        candidates.append((opt / "rocm", "opt", "/opt/rocm", None))
    versioned = sorted(opt.glob("rocm-*"), key=lambda p: _version_key(p.name), reverse=True)
    candidates += [(p, "opt", "/opt/rocm-*", None) for p in versioned if p.is_dir()]
    for site in _site_dirs(root, environ):
        sdk = _pip_sdk(site)
        if sdk:
            candidates.append((sdk[0], "pip", f"pip rocm_sdk in {site}", sdk[1]))
    usr = root / "usr"
    if (usr / "bin/hipcc").exists() or glob.glob(str(usr / "lib/*-linux-gnu/libamdhip64.so*")):
        candidates.append((usr, "distro", "distro packages", None))
    installs: dict[str, RocmInstall] = {}
    for path, kind, origin, version in candidates:
        real = os.path.realpath(path)
        if real in installs:
            prev = installs[real]
            installs[real] = dataclasses.replace(prev, origin=f"{prev.origin}, {origin}")
        else:
            installs[real] = _make_install(path, kind, origin, version)
    return list(installs.values())


# --- permissions, conda ---------------------------------------------------------------------
def _group_names(root: Path) -> dict[int, str]:
    names: dict[int, str] = {}
    for line in (_read(root / "etc/group") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            names[int(parts[2])] = parts[0]
    return names


def probe_access(root: Path | str = "/", environ: Mapping[str, str] | None = None):
    """(user, groups, kfd, dri, device_groups): who we are and whether the GPU nodes open.

    ``kfd``/``dri`` are ``ok``, ``denied`` or ``absent``. On a fake root, group membership is
    read from ``etc/group`` for ``$USER``.
    """
    root = Path(root)
    environ = os.environ if environ is None else environ
    names = _group_names(root)
    user = environ.get("USER") or environ.get("LOGNAME") or ""
    if str(root) == "/":
        import grp
        import pwd

        with contextlib.suppress(KeyError):
            user = pwd.getpwuid(os.getuid()).pw_name
        groups = []
        for gid in sorted(set(os.getgroups()) | {os.getgid()}):
            try:
                groups.append(grp.getgrgid(gid).gr_name)
            except KeyError:
                groups.append(str(gid))
    else:
        groups = [
            line.split(":")[0]
            for line in (_read(root / "etc/group") or "").splitlines()
            if user and user in line.split(":")[-1].split(",")
        ]

    def state(paths: Iterable[Path]) -> tuple[str, list[str]]:
        paths = list(paths)
        owners = []
        for p in paths:
            with contextlib.suppress(OSError):
                gid = p.stat().st_gid
                owners.append(names.get(gid, str(gid)))
        if not paths:
            return "absent", owners
        ok = any(os.access(p, os.R_OK | os.W_OK) for p in paths)
        return ("ok" if ok else "denied"), owners

    kfd, kfd_owners = state([p for p in [root / "dev/kfd"] if p.exists()])
    dri, dri_owners = state(sorted((root / "dev/dri").glob("renderD*")))
    return user, tuple(groups), kfd, dri, tuple(dict.fromkeys(kfd_owners + dri_owners))


def newest_symbol_version(path: str | os.PathLike[str] | None, namespace: str) -> str | None:
    """Newest ``<namespace>_X.Y[.Z]`` symbol version named in a library (read from its bytes):
    ``GLIBC`` in libc.so.6, ``GLIBCXX`` or ``CXXABI`` in libstdc++.so.6. None when unreadable."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    pattern = re.escape(namespace).encode() + rb"_(\d+\.\d+(?:\.\d+)?)\b"
    found = {m.decode() for m in re.findall(pattern, data)}
    return max(found, key=_version_key) if found else None


def _glibcxx_max(path: Path | None) -> str | None:
    """Newest ``GLIBCXX_3.4.N`` symbol version a libstdc++ provides."""
    return newest_symbol_version(path, "GLIBCXX")


def probe_conda(root: Path | str = "/", environ: Mapping[str, str] | None = None):
    """(prefix, its libstdc++, its newest GLIBCXX, the system's newest GLIBCXX, shadows?).

    An active conda env shadows the system libstdc++ when its lib dir is on LD_LIBRARY_PATH or
    when the build's Python is conda's own (its RPATH loads conda's lib first).
    """
    root = Path(root)
    environ = os.environ if environ is None else environ
    system = next(iter(sorted(root.glob("usr/lib/*-linux-gnu/libstdc++.so.6"))), None)
    prefix = environ.get("CONDA_PREFIX")
    if not prefix:
        return None, None, None, _glibcxx_max(system), False
    lib = Path(prefix) / "lib"
    libstdcxx = lib / "libstdc++.so.6"
    has = libstdcxx.exists()
    on_ld_path = any(
        os.path.realpath(d) == os.path.realpath(lib)
        for d in environ.get("LD_LIBRARY_PATH", "").split(":")
        if d
    )
    python = shutil.which("python", path=environ.get("PATH", os.defpath)) or ""
    conda_python = os.path.realpath(python).startswith(os.path.realpath(prefix) + os.sep)
    return (
        prefix,
        str(libstdcxx) if has else None,
        _glibcxx_max(libstdcxx) if has else None,
        _glibcxx_max(system),
        has and (on_ld_path or conda_python),
    )


# --- gather ---------------------------------------------------------------------------------
_THIS_RUN: dict[str, HostFacts] = {}  # build_dir -> this process's facts (see facts())


def facts(build_dir: Path | str | None = None) -> HostFacts:
    """This host's facts, gathered by the first caller in this process and shared with the rest:
    one ``nox`` run's sessions (toolchain, every package, lock) look at the machine once."""
    key = str(Path(build_dir).absolute()) if build_dir is not None else ""
    if key not in _THIS_RUN:
        _THIS_RUN[key] = gather(build_dir=build_dir)
    return _THIS_RUN[key]


def gather(
    environ: Mapping[str, str] | None = None,
    *,
    root: Path | str = "/",
    build_dir: Path | str | None = None,
) -> HostFacts:
    """Look at the host once and return its facts (well under a second; tools run in parallel)."""
    environ = dict(os.environ if environ is None else environ)
    root = Path(root)
    search = environ.get("PATH", os.defpath)
    compilers = find_compilers(environ)
    cc_exe = _compiler_exe(environ.get("CC"), environ)
    cxx_exe = _compiler_exe(environ.get("CXX"), environ)
    tool_paths = {name: shutil.which(name, path=search) for name in TOOL_VERSIONS}
    with ThreadPoolExecutor(max_workers=8) as pool:
        comp_jobs = {name: pool.submit(compiler_version, path, environ) for name, path in compilers.items()}
        cc_job = pool.submit(compiler_version, cc_exe, environ) if cc_exe else None
        cxx_job = pool.submit(compiler_version, cxx_exe, environ) if cxx_exe else None
        tool_jobs = {
            name: pool.submit(tool_version, path, name, environ) for name, path in tool_paths.items() if path
        }
        installs = find_rocm_installs(root, environ)
        cpus, online, quota = probe_cpus(root)
        mem, total, limit = probe_memory(root)
        disk_path, disk_free = probe_disk(build_dir or Path.cwd())
        os_name, kernel = probe_os(root)
        user, groups, kfd, dri, device_groups = probe_access(root, environ)
        conda = probe_conda(root, environ)
        gpus = read_kfd_topology(root) or []
        versions = {name: job.result() for name, job in comp_jobs.items()}
        tools = {name: (tool_jobs[name].result() if name in tool_jobs else None) for name in TOOL_VERSIONS}
        cc_version = cc_job.result() if cc_job else None
        cxx_version = cxx_job.result() if cxx_job else None
    hipcc = shutil.which("hipcc", path=search)
    cuda_home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if not cuda_home and (root / "usr/local/cuda").is_dir():
        cuda_home = str(root / "usr/local/cuda")
    return HostFacts(
        cpus=cpus,
        cpus_online=online,
        cpu_quota=quota,
        mem_bytes=mem,
        mem_total_bytes=total,
        mem_limit_bytes=limit,
        disk_path=disk_path,
        disk_free_bytes=disk_free,
        os=os_name,
        kernel=kernel,
        python=platform.python_version(),
        compilers={k: v for k, v in versions.items() if v},
        cc=environ.get("CC"),
        cxx=environ.get("CXX"),
        cc_version=cc_version,
        cxx_version=cxx_version,
        tools=tools,
        ccache=shutil.which("ccache", path=search),
        sccache=shutil.which("sccache", path=search),
        rocm_installs=tuple(installs),
        first_hipcc=hipcc,
        gpus=tuple(gpus),
        user=user,
        groups=groups,
        kfd=kfd,
        dri=dri,
        device_groups=device_groups,
        conda_prefix=conda[0],
        conda_libstdcxx=conda[1],
        conda_glibcxx=conda[2],
        system_glibcxx=conda[3],
        conda_shadows=conda[4],
        cuda_home=cuda_home,
        environ={k: environ[k] for k in ENV_KEYS if k in environ},
        os_id=probe_os_id(root),
    )
