"""``nox -s verify``: prove the wheelhouse runs on the target GPUs before anyone installs it.

The failures that otherwise show up hours later on the GPU machine, each checked here:

- ``hipErrorNoBinaryForGpu`` / ``invalid device function``: every shared object of every
  wheel must hold code for every configured arch, per offload bundle (``rocmforge.verify.inspect``);
- ``libhipblas.so.2: cannot open shared object file``: every ``DT_NEEDED`` library must
  resolve inside the environment, in a ROCm install or on the system, else we say which
  package provides it;
- crashes from version skew: torch with the Triton it pins, vLLM with the torch wheel it was
  built against, exactly one Triton installed, ``pip check`` clean;
- import smoke tests in subprocesses, so a SIGSEGV/SIGILL is reported with its likely cause;
- on a GPU: device visible, its arch built, matmul against the CPU, a Triton kernel, a few
  vLLM tokens from a dummy-weight model (``rocmforge/verify/probe.py`` runs inside the env).

The nox session builds a fresh uv venv from the wheelhouse alone (PyPI only for projects the
wheelhouse lacks). ``python -m rocmforge.verify --python PATH`` checks an existing
environment instead; ``--gpu-only`` runs just the GPU part.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rocmforge.build.install import REQUIREMENTS, install_argv, resolved_offline, uv_binary
from rocmforge.build.wheelfile import wheel_name
from rocmforge.errors import UserError
from rocmforge.fsutil import file_sha256
from rocmforge.verify import inspect

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("probe.py")
TINY_MODEL = ROOT / "examples" / "tiny-model"
TRITON_PROJECTS = frozenset({"triton", "pytorch-triton-rocm", "pytorch-triton", "triton-rocm"})
# glibc's default directories (after the cache), multiarch first as Debian/Ubuntu build it.
DEFAULT_LIB_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)
LD_SO_CACHE = Path("/etc/ld.so.cache")
# Sonames of CUDA's libraries and of CUDA torch's own (a ROCm torch has libtorch_hip, libc10_hip),
# also as auditwheel renames vendored copies (libcudart.faf08d9a.so.13): a shared object that
# needs one, or a package that ships one, is a CUDA build.
CUDA_LIBRARY = re.compile(
    r"lib(cudart|cublas|cublasLt|cudnn\w*|nccl|cufft\w*|curand|cusparse\w*|cusolver\w*|nvrtc|nvjpeg"
    r"|nvToolsExt|nvJitLink|cupti|cuda|cufile\w*|nvshmem\w*|torch_cuda\w*|c10_cuda)([.-][0-9a-f]{8})?\.so"
)
IMPORT_TIMEOUT = 600  # a first `import vllm` compiles nothing but can take a minute on a slow disk
GPU_TIMEOUT = 900

# soname pattern -> what provides it; the fix a user needs when the library is missing.
PROVIDERS: tuple[tuple[str, str], ...] = (
    (r"libamdhip64\.", "the HIP runtime: ROCm package hip-runtime-amd"),
    (r"libhipblaslt\.", "ROCm package hipblaslt"),
    (r"libhipblas\.", "ROCm package hipblas"),
    (r"librocblas\.", "ROCm package rocblas"),
    (r"libMIOpen\.", "ROCm package miopen-hip"),
    (r"librccl\.", "ROCm package rccl"),
    (r"libhipsparse(lt)?\.", "ROCm package hipsparse / hipsparselt"),
    (r"libhipsolver\.|librocsolver\.", "ROCm packages hipsolver / rocsolver"),
    (r"libhipfft\.|librocfft\.", "ROCm packages hipfft / rocfft"),
    (r"libhiprand\.|librocrand\.", "ROCm packages hiprand / rocrand"),
    (r"libroctx64\.|libroctracer64\.", "ROCm package roctracer"),
    (r"librocprofiler", "ROCm package rocprofiler"),
    (r"libhsa-runtime64\.", "ROCm package hsa-rocr"),
    (r"libamd_comgr\.", "ROCm package comgr"),
    (r"libaotriton", "AOTriton, shipped inside the torch wheel"),
    (r"libcudart\.", "the CUDA runtime (pip nvidia-cuda-runtime-cu12/13)"),
    (r"libcublas(Lt)?\.", "cuBLAS (pip nvidia-cublas-cu12/13)"),
    (r"libcudnn", "cuDNN (pip nvidia-cudnn-cu12/13)"),
    (r"libnccl\.", "NCCL (pip nvidia-nccl-cu12/13)"),
    (r"libtorch|libc10", "the torch wheel (install the matching torch)"),
    (r"libpython3", "a Python built with --enable-shared"),
    (r"libnuma\.", "Debian/Ubuntu package libnuma1"),
    (r"libdrm", "Debian/Ubuntu package libdrm2 / libdrm-amdgpu1"),
    (r"libelf\.", "Debian/Ubuntu package libelf1"),
    (r"libgomp\.|libstdc\+\+\.|libgcc_s\.", "the GCC runtime (libgomp1, libstdc++6)"),
)

# Signals that kill an import or a GPU run, with what usually causes each.
CRASH_CAUSES = {
    signal.SIGSEGV: "two Tritons overwriting each other, an extension built against another torch, "
    "or libraries from two ROCm installs mixed (check LD_LIBRARY_PATH)",
    signal.SIGILL: "code compiled for a newer CPU (-march=native on the build host) or a GPU arch "
    "forced with HSA_OVERRIDE_GFX_VERSION that the device lacks",
    signal.SIGABRT: "an uncaught C++ exception at load (undefined symbol, HIP runtime init); "
    "rerun with AMD_LOG_LEVEL=3 for the HIP log",
    signal.SIGBUS: "shared memory too small (/dev/shm in a container)",
    signal.SIGKILL: "out of memory (OOM killer) or the time limit",
}


@dataclass(frozen=True)
class Check:
    """One verdict: ``status`` is ok, fail, warn or skip."""

    section: str  # static, import, gpu
    name: str
    status: str
    detail: str


@dataclass(frozen=True)
class Environment:
    """What ``verify/probe.py dists`` reports about an interpreter's environment."""

    python: str
    site: tuple[str, ...]
    dists: dict[str, dict]  # canonical name -> {name, version, requires, provenance, shared_objects}

    def version(self, project: str) -> str | None:
        d = self.dists.get(canonicalize_name(project))
        return d["version"] if d else None


# ------------------------------------------------------------------------ environment


def probe_environment(python: str) -> Environment:
    """Ask ``python`` for its installed distributions (one subprocess, nothing imported)."""
    try:
        res = subprocess.run([python, str(PROBE), "dists"], capture_output=True, text=True)
    except OSError as exc:  # missing, a directory, not executable
        raise UserError(
            f"--python {python}: cannot run it ({exc.strerror}); give the environment's interpreter, "
            "e.g. .venv/bin/python"
        ) from None
    if res.returncode != 0:
        raise UserError(f"{python} cannot list its packages: {res.stderr.strip()[-300:]}")
    data = json.loads(res.stdout)
    dists = {canonicalize_name(d["name"]): d for d in data["dists"]}
    return Environment(data["python"], tuple(data["site"]), dists)


def required_archs(cfg) -> tuple[str, ...]:
    """What every bundle must cover: the ROCm archs, or sm_XX for a CUDA build, or nothing."""
    if cfg.build.backend == "rocm":
        return tuple(cfg.build.arch)
    if cfg.build.backend == "cuda":
        return tuple("sm_" + a.replace(".", "").lower().replace("+ptx", "") for a in cfg.build.cuda_arch)
    return ()


# ---------------------------------------------------------------------- static checks


def package_archs(cfg) -> dict[str, tuple[str, ...]]:
    """Configured package -> the archs it is built for, where its ``arch`` list narrows
    ``build.arch`` (aiter: gfx942, gfx950); coverage asks no more of its wheel."""
    from rocmforge.config import package_archs as archs_of

    if cfg.build.backend != "rocm":
        return {}
    return {name: archs_of(cfg, pkg) for name, pkg in cfg.packages.items() if pkg.arch is not None}


def _narrowed(required: tuple[str, ...], provenance: dict | None, narrow) -> tuple[str, ...]:
    """``required`` for one wheel: only the archs its package is built for (by its provenance's name)."""
    package = (provenance or {}).get("package")
    if not narrow or package not in narrow:
        return required
    keep = {a.split(":")[0] for a in narrow[package]}
    return tuple(a for a in required if a.split(":")[0] in keep)


def coverage_checks(wheels: Iterable[Path], required: tuple[str, ...], narrow=None) -> list[Check]:
    """Per wheel: does every bundle of every shared object cover ``required`` (narrowed to its
    package's archs by ``narrow``, see :func:`package_archs`)?"""
    from rocmforge.build.provenance import FILENAME
    from rocmforge.build.wheelfile import read_member

    checks = []
    full = required
    for wheel in wheels:
        own = read_member(wheel, FILENAME) if narrow else None
        required = _narrowed(full, json.loads(own) if own else None, narrow)
        report = inspect.inspect_paths([wheel], required)
        with_code = [f for f in report.files if f.bundles]
        name = f"archs: {wheel.name}"
        if report.missing:
            checks.append(
                _gaps_check(name, [f"{m.member} bundle {m.bundle} lacks {m.arch}" for m in report.missing])
            )
        else:
            archs = sorted({a for f in with_code for a in f.archs})
            detail = (
                f"{len(report.files)} shared objects, {len(with_code)} with GPU code "
                f"({' '.join(archs) or '-'})"
            )
            checks.append(
                Check(
                    "static", name, "ok", detail + (f"; all cover {','.join(required)}" if with_code else "")
                )
            )
    return checks


def provider(soname: str) -> str:
    """Who ships ``soname``, for the message about a library that does not resolve."""
    for pattern, what in PROVIDERS:
        if re.match(pattern, soname):
            return what
    return "unknown; search with `apt-file search " + soname + "`"


def _rocm_lib_dirs(environ) -> list[Path]:
    """Library directories of the ROCm installs here: named in hints, never searched."""
    roots = [environ[k] for k in ("ROCM_PATH", "HIP_PATH") if environ.get(k)]
    roots += sorted(str(p) for p in Path("/opt").glob("rocm*"))
    return [Path(r) / sub for r in roots for sub in ("lib", "lib64")]


# What ``ldconfig -p`` calls this machine's word size and architecture, to skip 32-bit entries.
_CACHE_ARCH = {"x86_64": "x86-64", "aarch64": "AArch64", "ppc64le": "64bit"}


def ldconfig_path() -> str | None:
    """The ldconfig binary, also where a user's PATH on Debian does not look (/sbin)."""
    return shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")


def ld_cache(cache: Path = LD_SO_CACHE) -> dict[str, str]:
    """soname -> library path for this architecture in the dynamic loader's cache
    (``ldconfig -p -C CACHE``; ROCm's packages register ``/opt/rocm/lib`` there)."""
    ldconfig = ldconfig_path()
    if ldconfig is None:
        return {}
    try:
        out = subprocess.run([ldconfig, "-p", "-C", str(cache)], capture_output=True, text=True).stdout
    except OSError:
        return {}
    arch = _CACHE_ARCH.get(platform.machine(), "")
    found: dict[str, str] = {}
    for line in out.splitlines()[1:]:
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (.+)$", line)
        if m and arch in m[2]:
            found.setdefault(m[1], m[3])  # the first entry is the one the loader takes
    return found


def _expand(dirs: Iterable[str], origin: Path) -> list[Path]:
    """RPATH/RUNPATH entries with ``$ORIGIN`` expanded; entries with other tokens are dropped."""
    out = []
    for d in dirs:
        d = d.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin))
        if "$" not in d:
            out.append(Path(d))
    return out


class LibraryResolver:
    """Finds a ``DT_NEEDED`` soname as the dynamic loader (ld.so) does, and nowhere else.

    In the loader's order: the object's ``DT_RPATH`` (only when it has no ``DT_RUNPATH``),
    ``LD_LIBRARY_PATH``, its ``DT_RUNPATH`` (``$ORIGIN`` expanded), the loader's cache
    (``/etc/ld.so.cache``), the default directories. A library under ``/opt/rocm*`` that none
    of these reach is *not* found: the process would fail the same way.
    """

    def __init__(self, environ=None, cache: Path = LD_SO_CACHE):
        environ = os.environ if environ is None else environ
        self.ld_library_path = [Path(p) for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        self.cache = ld_cache(cache)
        self.rocm_dirs = _rocm_lib_dirs(environ)

    def resolve(self, soname: str, obj: Path, rpath: Iterable[str], runpath: Iterable[str]) -> str | None:
        """The path the loader would open for ``soname`` needed by ``obj``; None when none."""
        if "/" in soname:
            return soname if Path(soname).is_file() else None
        origin = obj.resolve().parent
        dirs = [
            *(() if runpath else _expand(rpath, origin)),
            *self.ld_library_path,
            *_expand(runpath, origin),
        ]
        for d in dirs:
            if (d / soname).is_file():
                return str(d / soname)
        if soname in self.cache:
            return self.cache[soname]
        return next((str(d / soname) for d in map(Path, DEFAULT_LIB_DIRS) if (d / soname).is_file()), None)

    def unreachable(self, soname: str) -> str | None:
        """A ROCm directory that holds ``soname`` although the loader does not search it."""
        return next((str(d) for d in self.rocm_dirs if (d / soname).is_file()), None)


@functools.lru_cache(maxsize=4096)
def _dynamic(path: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(NEEDED, RPATH, RUNPATH) of a shared object, read once per run."""
    info = inspect.elf_dynamic(path)
    return (info.needed, info.rpath, info.runpath) if info is not None else ((), (), ())


def _shared_objects(dist: dict) -> list[Path]:
    return [Path(so) for so in dist["shared_objects"] if Path(so).is_file()]


def _closure(env: Environment, name: str) -> set[str]:
    """``name`` and every installed distribution it requires, transitively."""
    seen, todo = set(), [canonicalize_name(name)]
    while todo:
        current = todo.pop()
        if current in seen or current not in env.dists:
            continue
        seen.add(current)
        todo += [canonicalize_name(r.name) for r in _requirements(env.dists[current])]
    return seen


def library_checks(
    env: Environment, projects: Iterable[str], environ=None, cache: Path = LD_SO_CACHE
) -> list[Check]:
    """One check per project: all ``DT_NEEDED`` libraries of its shared objects resolve.

    Besides the loader's search, a soname counts as found when a shared object of that name
    belongs to the project or to one it requires (torch's ``libc10.so`` for vLLM's ``_C.so``):
    importing the project loads that one first, and the loader reuses a loaded soname.
    """
    resolver = LibraryResolver(environ, cache)
    checks = []
    for project in projects:
        dist = env.dists.get(canonicalize_name(project))
        if dist is None:
            continue
        loaded_first = {so.name for dep in _closure(env, project) for so in _shared_objects(env.dists[dep])}
        missing: dict[str, list[str]] = {}
        objects = _shared_objects(dist)
        for path in objects:
            needed, rpath, runpath = _dynamic(str(path))
            for soname in needed:
                if soname not in loaded_first and resolver.resolve(soname, path, rpath, runpath) is None:
                    missing.setdefault(soname, []).append(path.name)
        name = f"libraries: {dist['name']}"
        if missing:
            parts = []
            for lib, by in sorted(missing.items()):
                where = resolver.unreachable(lib)
                why = (
                    f"is in {where} but the loader does not search there (add it to /etc/ld.so.conf.d/ "
                    "and run ldconfig, as ROCm's packages do, or to LD_LIBRARY_PATH)"
                    if where
                    else f"not found; provided by {provider(lib)}"
                )
                parts.append(f"{lib} (needed by {', '.join(sorted(set(by))[:3])}) {why}")
            checks.append(Check("static", name, "fail", "; ".join(parts)))
        else:
            checks.append(
                Check("static", name, "ok", f"{len(objects)} shared objects, every NEEDED library resolves")
            )
    return checks


def origin(dist: dict) -> str:
    """Where an installed distribution came from, as far as its installer recorded it."""
    installer = dist.get("installer") or "an unknown installer"
    direct = dist.get("direct_url")
    if dist.get("provenance"):
        source = "a wheel rocmforge built"
    elif direct and direct.get("url"):
        source = direct["url"]
    else:
        # pip and uv record no index URL: the configured index (PyPI unless set otherwise).
        source = "a package index (PyPI unless pip/uv were configured otherwise)"
    return f"installed by {installer} from {source}"


def cuda_checks(env: Environment) -> list[Check]:
    """ROCm environment: a distribution whose shared objects need CUDA libraries is a CUDA build."""
    checks = []
    for key in sorted(env.dists):
        dist = env.dists[key]
        cuda: dict[str, set[str]] = {}
        for path in _shared_objects(dist):
            if CUDA_LIBRARY.match(path.name):
                cuda.setdefault(path.name, set()).add("shipped in it")
            for soname in _dynamic(str(path))[0]:
                if CUDA_LIBRARY.match(soname):
                    cuda.setdefault(soname, set()).add(f"by {path.name}")
        if cuda:
            libs = ", ".join(f"{lib} ({', '.join(sorted(by)[:2])})" for lib, by in sorted(cuda.items()))
            checks.append(
                Check(
                    "static",
                    f"no CUDA: {dist['name']}",
                    "fail",
                    f"{dist['name']} {dist['version']} is a CUDA build: it needs {libs}; {origin(dist)}. "
                    "Install its ROCm build (from the wheelhouse, or the ROCm index of its project) "
                    "or uninstall it",
                )
            )
    if not checks:
        with_so = sum(bool(_shared_objects(d)) for d in env.dists.values())
        checks.append(
            Check("static", "no CUDA builds", "ok", f"no shared object of {with_so} packages needs CUDA")
        )
    return checks


def vllm_platform_checks(env: Environment) -> list[Check]:
    """ROCm environment: vLLM detects the ROCm platform through amdsmi; without it, it does not."""
    vllm = env.dists.get("vllm")
    if vllm is None:
        return []
    amdsmi = env.dists.get("amdsmi")
    if amdsmi is not None:
        return [Check("static", "vLLM on ROCm", "ok", f"amdsmi {amdsmi['version']} installed")]
    return [
        Check(
            "static",
            "vLLM on ROCm",
            "fail",
            f"vllm {vllm['version']} is installed without amdsmi: vLLM finds AMD GPUs through amdsmi and, "
            "without it, does not take the ROCm platform (the engine then fails to start); install "
            "amdsmi matching the ROCm version (pip install /opt/rocm/share/amd_smi, or amdsmi from PyPI)",
        )
    ]


def installed_coverage_checks(
    env: Environment, required: tuple[str, ...], skip=frozenset(), narrow=None
) -> tuple[list[Check], set[str]]:
    """Per installed distribution with GPU code: every bundle of its shared objects covers
    ``required`` (narrowed per package by ``narrow``). Also returns the names of the
    distributions that hold GPU code."""
    checks, with_gpu_code = [], set()
    full = required
    for key in sorted(env.dists):
        dist = env.dists[key]
        objects = _shared_objects(dist)
        if key in skip or not objects:
            continue
        required = _narrowed(full, dist.get("provenance"), narrow)
        report = inspect.inspect_paths(objects, required)
        with_code = [f for f in report.files if f.bundles]
        if not with_code:
            continue
        with_gpu_code.add(key)
        name = f"archs: {dist['name']}"
        if report.missing:
            checks.append(
                _gaps_check(
                    name, [f"{Path(m.path).name} bundle {m.bundle} lacks {m.arch}" for m in report.missing]
                )
            )
        else:
            archs = " ".join(sorted({a for f in with_code for a in f.archs}))
            cover = f"; all cover {','.join(required)}" if required else ""
            checks.append(
                Check("static", name, "ok", f"{len(with_code)} shared objects with GPU code ({archs}){cover}")
            )
    return checks, with_gpu_code


def _gaps_check(name: str, gaps: list[str]) -> Check:
    """A failed coverage check naming the first five gaps (a fat binary can lack hundreds)."""
    more = f" (+{len(gaps) - 5} more)" if len(gaps) > 5 else ""
    return Check("static", name, "fail", "; ".join(gaps[:5]) + more)


def _satisfies(version: str | None, req: Requirement) -> bool:
    if version is None:
        return False
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _parsed(texts) -> list[Requirement]:
    """The requirements among ``texts`` that parse; a malformed one checks nothing."""
    out = []
    for text in texts or ():
        try:
            out.append(Requirement(text))
        except InvalidRequirement:
            continue
    return out


def _requirements(dist: dict) -> list[Requirement]:
    """The dist's requirements outside extras: what installing it pulls in."""
    return [r for r in _parsed(dist.get("requires")) if r.marker is None or "extra" not in str(r.marker)]


def _dropped(dist: dict) -> list[Requirement]:
    """Requirements rocmforge removed from the wheel's metadata, kept in its provenance."""
    return _parsed((dist.get("provenance") or {}).get("dropped_requirements"))


def version_checks(env: Environment, wheelhouse_sha256: dict[str, str] | None = None) -> list[Check]:
    """Exactly one Triton; torch with its pinned Triton; vLLM with its torch; built-against wheels."""
    checks = []
    tritons = sorted(p for p in TRITON_PROJECTS if p in env.dists)
    if len(tritons) > 1:
        listed = " and ".join(f"{env.dists[p]['name']} {env.dists[p]['version']}" for p in tritons)
        checks.append(
            Check(
                "static",
                "one Triton",
                "fail",
                f"{listed} are both installed; they write the same `triton` package and crash "
                f"each other: uninstall all but the one torch pins",
            )
        )
    elif tritons:
        checks.append(
            Check(
                "static",
                "one Triton",
                "ok",
                f"{env.dists[tritons[0]]['name']} {env.dists[tritons[0]]['version']}",
            )
        )

    torch = env.dists.get("torch")
    if torch is not None:
        pins = [
            r for r in _requirements(torch) + _dropped(torch) if canonicalize_name(r.name) in TRITON_PROJECTS
        ]
        if not pins:
            checks.append(
                Check(
                    "static", "torch ↔ Triton", "skip", "torch names no Triton in its metadata or provenance"
                )
            )
        else:
            pin = pins[0]
            have = [(p, env.version(p)) for p in tritons]
            ok = any(_satisfies(v, pin) for _p, v in have)
            found = ", ".join(f"{p} {v}" for p, v in have) or "none"
            checks.append(
                Check(
                    "static",
                    "torch ↔ Triton",
                    "ok" if ok else "fail",
                    f"torch {torch['version']} pins {pin}; installed: {found}",
                )
            )

    vllm = env.dists.get("vllm")
    if vllm is not None and torch is not None:
        reqs = [r for r in _requirements(vllm) + _dropped(vllm) if canonicalize_name(r.name) == "torch"]
        if reqs:
            ok = all(_satisfies(torch["version"], r) for r in reqs)
            checks.append(
                Check(
                    "static",
                    "vLLM ↔ torch",
                    "ok" if ok else "fail",
                    f"vllm {vllm['version']} needs {', '.join(map(str, reqs))}; "
                    f"torch {torch['version']} installed",
                )
            )

    checks += _exact_pins(env)
    if wheelhouse_sha256 is not None:
        checks.extend(_built_against(env, wheelhouse_sha256))
    return checks


def _exact_pins(env: Environment) -> list[Check]:
    """Each wheel we built names the wheels it was built against at ``==`` (provenance
    ``exact_pins``): torch its Triton, torchvision and torchaudio their torch, vLLM all of them."""
    checks = []
    for dist in env.dists.values():
        pins = (dist.get("provenance") or {}).get("exact_pins") or {}
        if not pins:
            continue
        found = {p: env.version(p) for p in pins}
        bad = [p for p, spec in pins.items() if not _satisfies(found[p], Requirement(f"{p}{spec}"))]
        detail = ", ".join(
            f"{p}{spec} ({'installed ' + found[p] if found[p] else 'not installed'})"
            for p, spec in pins.items()
        )
        checks.append(Check("static", f"{dist['name']} pins", "fail" if bad else "ok", detail))
    return checks


def _built_against(env: Environment, wheelhouse_sha256: dict[str, str]) -> list[Check]:
    """Wheels record the sha256 of each dependency wheel they were built against (provenance)."""
    checks = []
    for dist in env.dists.values():
        deps = ((dist.get("provenance") or {}).get("dependencies")) or {}
        for dep, sha in deps.items():
            ok = sha in wheelhouse_sha256
            detail = (
                f"built against {wheelhouse_sha256[sha]}"
                if ok
                else f"built against a {dep} wheel (sha256 {sha[:12]}) that is no longer in the wheelhouse; "
                f"rebuild it: nox -s {canonicalize_name(dist['name'])}"
            )
            checks.append(Check("static", f"{dist['name']} ↔ {dep}", "ok" if ok else "fail", detail))
    return checks


def pip_check(python: str) -> Check:
    """``uv pip check`` of the environment."""
    res = subprocess.run([uv_binary(), "pip", "check", "--python", python], capture_output=True, text=True)
    text = (res.stdout + res.stderr).strip()
    if res.returncode == 0:
        return Check("static", "pip check", "ok", text.splitlines()[-1] if text else "no broken requirements")
    return Check("static", "pip check", "fail", " | ".join(text.splitlines()[-6:]))


# --------------------------------------------------------------------- runtime checks


def _crash(returncode: int) -> str | None:
    """``SIGSEGV: likely ...`` for a process killed by a signal, else None."""
    if returncode >= 0:
        return None
    sig = signal.Signals(-returncode)
    return f"crashed with {sig.name}; likely cause: {CRASH_CAUSES.get(sig, 'see the output above')}"


def import_checks(python: str, modules: Iterable[str], environ=None) -> list[Check]:
    """Import each module in its own process; report crashes by signal and missing libraries."""
    checks = []
    for module in modules:
        try:
            res = subprocess.run(
                [python, str(PROBE), "import", module],
                capture_output=True,
                text=True,
                timeout=IMPORT_TIMEOUT,
                env=environ,
            )
        except subprocess.TimeoutExpired:
            checks.append(Check("import", f"import {module}", "fail", f"no answer after {IMPORT_TIMEOUT}s"))
            continue
        crash = _crash(res.returncode)
        if crash:
            checks.append(Check("import", f"import {module}", "fail", crash))
        elif res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            lib = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", last)
            if lib:
                detail = f"{last}; {lib[1]} is provided by {provider(lib[1])}"
            else:
                detail = _with_diagnosis(last, res.stderr)
            checks.append(Check("import", f"import {module}", "fail", detail))
        else:
            checks.append(Check("import", f"import {module}", "ok", "imported"))
    return checks


def _sure_summary(output: str) -> str | None:
    """What ``rocmforge diagnose`` makes of a failure's ``output`` when it recognises it surely (a
    rule for the phenomenon, or a failure outside every category with its own next step, such as
    vLLM's KV cache not fitting); its guesses are left out of a report."""
    from rocmforge.diagnose.engine import diagnose_text, summary

    diagnosis = diagnose_text(output)
    return None if diagnosis.confidence == "low" else summary(diagnosis)


def _with_diagnosis(detail: str, output: str) -> str:
    """``detail``, and :func:`_sure_summary` of the failure's ``output`` when there is one."""
    said = _sure_summary(output)
    return detail if said is None else f"{detail}; {said}"


def gpu_checks(python: str, archs: tuple[str, ...], model: Path | None, environ=None) -> list[Check]:
    """The GPU part, run by ``verify/probe.py gpu`` inside the environment."""
    argv = [python, str(PROBE), "gpu", *[f"--arch={a}" for a in archs]]
    if model is not None:
        argv.append(f"--model={model}")
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=GPU_TIMEOUT, env=environ)
    except subprocess.TimeoutExpired:
        return [Check("gpu", "gpu: run", "fail", f"no answer after {GPU_TIMEOUT}s")]
    # A failed check's detail is its exception, diagnosed first; when that says nothing the run's
    # stderr may (vLLM's engine process prints the root cause there and raises only "See root
    # cause above"). The stderr is one for all checks: diagnosed once, when first needed.
    from_stderr = functools.cache(lambda: _sure_summary(res.stderr))
    checks = []
    for d in (json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")):
        detail = d["detail"]
        if d["status"] == "fail" and (said := _sure_summary(detail) or from_stderr()) is not None:
            detail = f"{detail}; {said}"
        checks.append(Check("gpu", d["name"], d["status"], detail))
    # The checks done before a crash are kept; the crash itself is the last finding.
    crash = _crash(res.returncode)
    if crash or (res.returncode != 0 and not checks):
        tail = res.stderr.strip().splitlines()[-1:] or ["(no output)"]
        checks.append(Check("gpu", "gpu: run", "fail", crash or tail[0]))
    return checks


# ------------------------------------------------------------------------------ driver


def from_wheelhouse(env: Environment, wheels: Iterable[Path] = ()) -> set[str]:
    """Installed distributions that came from the wheelhouse: built by rocmforge (provenance
    inside), or the same project and version as one of ``wheels`` (a prebuilt wheel published as is)."""
    ours = {n for n, d in env.dists.items() if d.get("provenance")}
    for wheel in wheels:
        name = wheel_name(wheel)
        have = env.version(name.project)
        if have is not None and _same_version(have, name.version):
            ours.add(name.project)
    return ours


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def modules_to_import(env: Environment, ours: Iterable[str] = ()) -> list[str]:
    """torch, triton and vllm, those installed, then every top-level module of ``ours``."""
    wanted = [("torch", "torch"), ("triton", None), ("vllm", "vllm")]
    out = []
    for module, project in wanted:
        present = any(p in env.dists for p in TRITON_PROJECTS) if project is None else project in env.dists
        if present:
            out.append(module)
    for name in sorted(ours):
        out += [m for m in env.dists[name].get("modules") or () if m not in out]
    return out


def rocm_environment(archs: tuple[str, ...]) -> bool:
    """Whether the stack being verified is a ROCm one (its archs are gfx targets)."""
    return bool(archs) and all(a.startswith("gfx") for a in archs)


# Checks that run whatever is installed: they alone do not make a verification.
_ENVIRONMENT_WIDE = frozenset({"pip check", "no CUDA builds"})


def run(
    python: str,
    *,
    archs: tuple[str, ...],
    wheels: list[Path] = (),
    projects: list[str] | None = None,
    static: bool = True,
    gpu: bool = True,
    model: Path | None = TINY_MODEL,
    environ=None,
    cache: Path = LD_SO_CACHE,
    narrow: dict[str, tuple[str, ...]] | None = None,
) -> list[Check]:
    """All checks against the environment of ``python`` (and the ``wheels`` it came from).

    Without ``projects``, the libraries of the stack (torch, Triton, vLLM), of everything from
    the wheelhouse and of every package with GPU code are checked. Nothing checked is a failure.
    """
    checks: list[Check] = []
    if static:
        env = probe_environment(python)
        ours = from_wheelhouse(env, wheels)
        if wheels:
            checks += coverage_checks(wheels, archs, narrow)
        # Every installed package's GPU code, whether or not a wheel of it was given.
        wheel_projects = {wheel_name(w).project for w in wheels} & ours
        coverage, with_code = installed_coverage_checks(env, archs, skip=wheel_projects, narrow=narrow)
        checks += coverage
        if projects is None:
            stack = {n for n in ("torch", "vllm", *TRITON_PROJECTS) if n in env.dists}
            projects = sorted(ours | stack | with_code)
        checks += library_checks(env, projects, environ, cache)
        if rocm_environment(archs):
            checks += cuda_checks(env) + vllm_platform_checks(env)
        checks += version_checks(env, _wheel_hashes(wheels) if wheels else None)
        checks.append(pip_check(python))
        checks += import_checks(python, modules_to_import(env, ours), environ)
    if gpu:
        checks += gpu_checks(python, archs, model, environ)
    if all(c.status == "skip" or c.name in _ENVIRONMENT_WIDE for c in checks):
        checks.append(
            Check(
                "static" if static else "gpu",
                "anything verified",
                "fail",
                f"no check ran against {python}: "
                + (
                    "none of torch, triton, vllm or a wheel from the wheelhouse is installed there; give "
                    "the stack's environment (--python /path/to/venv/bin/python) or run `nox -s verify`, "
                    "which installs the wheelhouse into a fresh venv"
                    if static
                    else "every GPU check was skipped (no GPU, or no torch there); run it on a GPU node "
                    "in the stack's environment"
                ),
            )
        )
    return checks


def _wheel_hashes(wheels: Iterable[Path]) -> dict[str, str]:
    """sha256 -> wheel file name, to match the hashes provenance records."""
    return {file_sha256(w): w.name for w in wheels}


def fresh_venv(venv: Path, wheelhouse: Path, python: str, *, offline: bool = False) -> tuple[str, list[Path]]:
    """A new uv venv holding every project of the wheelhouse; returns (python, wheels)."""
    from rocmforge.build.wheelhouse import Wheelhouse

    house = Wheelhouse(wheelhouse)
    entries = house.entries()
    if not entries:
        raise UserError(f"no wheels in {wheelhouse}: build them first (nox -s pytorch triton vllm)")
    uv = uv_binary()
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([uv, "venv", "--quiet", "--python", python, str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    if offline:  # the wheelhouse alone (its wheels need nothing from elsewhere)
        source = ["--no-index", "--find-links", str(house.root)]
        attempts = [[uv, "pip", "install", "--python", vpy, *source, *sorted({e.project for e in entries})]]
    elif (house.root / REQUIREMENTS).is_file():
        # The documented install: exactly requirements.txt, hashes required, our index first;
        # then, with no network now, from what this machine has (uv's cache, the offline export).
        attempts = [install_argv("uv", house.root, python=vpy, offline=True)]
        if not resolved_offline(house.root):
            attempts.insert(0, install_argv("uv", house.root, python=vpy))
    else:
        raise UserError(
            f"{house.root / REQUIREMENTS} is missing (it could not be resolved when the index was "
            "written); run `nox -s index` for the reason"
        )
    # Our own wheels are read from the wheelhouse, never from uv's cache: a rebuild at the same
    # version has the same file name at the same path, and uv once installed the wheel it had
    # cached for that path (a vLLM built against an earlier torch) instead of the one there now.
    # uv refuses a refresh with --offline; those installs name our wheels by their hashes
    # (requirements.txt) or by their paths, which uv checks against the files.
    refresh = [f"--refresh-package={p}" for p in sorted({e.project for e in entries})]
    for argv in attempts:
        fresh = [] if "--offline" in argv else refresh
        res = subprocess.run([*argv[:3], "--quiet", *fresh, *argv[3:]], capture_output=True, text=True)
        if res.returncode == 0:
            return vpy, [e.path for e in entries]
    if not offline:
        # Not even that (PyPI's wheels never downloaded here): our wheels alone, so that the
        # checks run and name what is missing instead of verify stopping for want of a network.
        alone = [uv, "pip", "install", "--quiet", "--python", vpy, "--offline", "--no-deps"]
        if subprocess.run([*alone, *(str(e.path) for e in entries)], capture_output=True).returncode == 0:
            from rocmforge.console import console

            console.print(
                "warning: installed the wheelhouse's wheels without their dependencies: "
                + (res.stderr.strip().splitlines() or ["(no output)"])[-1],
                markup=False,
                soft_wrap=True,
            )
            return vpy, [e.path for e in entries]
    raise UserError(f"installing the wheelhouse into {venv} failed: {res.stderr.strip()[-500:]}")


def report(checks: list[Check], *, as_json: bool) -> int:
    """Print the table (stderr) or JSON (stdout); 1 when any check failed."""
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        json.dump({"ok": not failed, "checks": [asdict(c) for c in checks]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return int(failed)
    from rich.table import Table

    from rocmforge.console import console

    colour = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "dim"}
    table = Table(title="rocmforge verify")
    for column in ("section", "check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for c in checks:
        table.add_row(c.section, c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail)
    console.print(table)
    counts = {s: sum(c.status == s for c in checks) for s in colour}
    console.print(
        ", ".join(f"{n} {s}" for s, n in counts.items() if n) + (" - FAILED" if failed else " - OK")
    )
    return int(failed)


def nox_session(session, cfg) -> None:
    """``nox -s verify``: fresh venv from the wheelhouse, then every check (``-- --no-gpu``, ``--json``)."""
    args = build_parser().parse_args(session.posargs)
    venv = cfg.build.work_dir / "verify-venv"
    session.log(f"installing {cfg.build.wheelhouse} into a fresh venv at {venv}")
    python, wheels = fresh_venv(venv, cfg.build.wheelhouse, cfg.build.python or sys.executable)
    checks = run(
        python,
        archs=_archs(args, cfg),
        wheels=wheels,
        gpu=not args.no_gpu,
        static=not args.gpu_only,
        narrow=package_archs(cfg),
    )
    if report(checks, as_json=args.json):
        session.error("verify failed: see the table above")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m rocmforge verify`` (also ``nox -s verify -- ...``)."""
    parser.add_argument("--python", default=sys.executable, help="interpreter of the environment to check")
    parser.add_argument(
        "--wheelhouse", type=Path, help="also check these wheels' code objects and provenance"
    )
    parser.add_argument("--arch", help="comma-separated archs to require (default: build_config.toml)")
    parser.add_argument("--model", type=Path, default=TINY_MODEL, help="model config dir for the vLLM check")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-only", action="store_true", help="only the GPU checks")
    gpu.add_argument("--no-gpu", action="store_true", help="skip the GPU checks")
    parser.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")


def build_parser() -> argparse.ArgumentParser:
    """The parser the nox session reads its ``--`` arguments with."""
    parser = argparse.ArgumentParser(prog="nox -s verify --", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser


def _archs(args: argparse.Namespace, cfg=None) -> tuple[str, ...]:
    if args.arch:
        return inspect.parse_required(args.arch, key="--arch")
    if cfg is None:
        from rocmforge.config import load_config

        cfg = load_config()
    return required_archs(cfg)


def main(args: argparse.Namespace) -> int:
    """Check an existing environment (``--python``), optionally with the wheels it came from."""
    wheels = sorted(args.wheelhouse.glob("*.whl")) if args.wheelhouse else []
    if args.wheelhouse and not wheels:
        # Checking "these wheels" with no wheels would pass vacuously.
        raise UserError(
            f"--wheelhouse {args.wheelhouse}: no wheels there; build them first (nox -s pytorch triton vllm) "
            "or drop --wheelhouse to check the environment alone"
        )
    from rocmforge.config import config_path, load_config

    cfg = load_config() if config_path().is_file() else None
    checks = run(
        args.python,
        archs=_archs(args, cfg),
        narrow=package_archs(cfg) if cfg else None,
        wheels=wheels,
        static=not args.gpu_only,
        gpu=not args.no_gpu,
        model=args.model,
    )
    return report(checks, as_json=args.json)
