"""The build environment of a package: one pure function of (config, package, host facts).

:func:`build_environment` returns the variables rocmforge sets for a package's build; a build
runs with ``{**os.environ, **env}``. Nothing here reads or changes ``os.environ``: the base
environment comes from ``base_env`` (or the environment recorded in the host facts), so the
same inputs always give the same result, and ``python -m rocmforge env PACKAGE --shell`` prints
it as ``export`` lines to reproduce a build by hand.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmforge.build import compile_cache, recipes
from rocmforge.config import Config, Package, require_package_archs
from rocmforge.errors import UserError
from rocmforge.host import HostFacts, RocmInstall, selected_rocm

GIB = 1 << 30
# Directories the dynamic linker and cmake search anyway; putting them first would shadow
# the user's own PATH order (Debian's ROCm lives here).
SYSTEM_DIRS = re.compile(r"/usr|/usr/bin|/usr/lib(?:64|/[^/]+-linux-gnu)?|/bin|/lib(?:64)?")


def satisfies(version: str | None, spec: str) -> bool:
    """Whether a tool version meets a PEP 440 specifier (``"12.2.0"``, ``">=13"`` -> False)."""
    if not version:
        return False
    try:
        return Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        return False


def parallel_jobs(cfg: Config, package: Package, facts: HostFacts) -> int:
    """``build.jobs`` (or MAX_JOBS) when set, else min(usable cores, memory / gb_per_job)."""
    if cfg.build.jobs:
        return cfg.build.jobs
    by_memory = int(facts.mem_bytes / (package.gb_per_job * GIB))
    return max(1, min(facts.cpus, by_memory))


def pick_compilers(package: Package, facts: HostFacts) -> tuple[str | None, str | None]:
    """The C/C++ compilers for a package: $CC/$CXX if set, else the gcc that meets its pins.

    Plain ``gcc`` wins when it satisfies the package's ``gcc``/``g++`` requirements;
    otherwise the newest versioned ``gcc-N`` that does (with its ``g++-N``), so installing
    gcc-13 beside the distro's gcc-12 is enough.
    """
    if facts.cc or facts.cxx:
        return facts.cc, facts.cxx
    specs = [r.spec for r in package.requires if r.tool in ("gcc", "g++")]
    versioned = sorted((c for c in facts.compilers if c.startswith("gcc-")), key=lambda c: int(c[4:]))
    candidates = ["gcc", *reversed(versioned)]
    present = [
        c for c in candidates if c in facts.compilers and c.replace("gcc", "g++", 1) in facts.compilers
    ]
    for cc in present:
        if all(satisfies(facts.compilers[cc], s) for s in specs):
            return cc, cc.replace("gcc", "g++", 1)
    return (present[0], present[0].replace("gcc", "g++", 1)) if present else (None, None)


def rocm_for_build(cfg: Config, facts: HostFacts) -> RocmInstall:
    """The ROCm install a ROCm build uses, or a one-line error saying what to do."""
    rocm_path = facts.environ.get("ROCM_PATH")
    if rocm_path and not os.path.isdir(rocm_path):
        what = "is not a directory" if os.path.exists(rocm_path) else "does not exist"
        raise UserError(
            f"ROCM_PATH={rocm_path} {what}; unset it or point it at a ROCm install (e.g. /opt/rocm-7.2.0)"
        )
    rocm = selected_rocm(facts)
    if rocm is None:
        from rocmforge.hints import install_hint

        how = install_hint("rocm", facts.os_id, spec=cfg.rocm_version or "")
        raise UserError(f"no ROCm found; {how}, then run `nox -s toolchain`")
    return rocm


def _prepend(dirs: list[str | None], current: str | None) -> str:
    """``dirs`` (system dirs skipped) in front of a ``:``-list, each entry once."""
    parts = [d for d in dirs if d and not SYSTEM_DIRS.fullmatch(d.rstrip("/"))] + (
        current.split(os.pathsep) if current else []
    )
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def _flags(base: str | None, opt_level: str) -> str:
    # Appended, so our -O level wins over an -O in the user's CFLAGS (the last -O counts).
    return f"{base} -{opt_level}".strip() if base else f"-{opt_level}"


def build_environment(
    cfg: Config,
    package_name: str,
    facts: HostFacts,
    *,
    base_env: Mapping[str, str] | None = None,
    ctx: recipes.Context | None = None,
    cache: bool = True,
) -> dict[str, str]:
    """The variables rocmforge sets for ``package_name``'s build (pure: no os.environ access).

    ``base_env`` is the environment the build starts from (default: the one recorded in
    ``facts``); PATH-like variables extend it. With the recipe context ``ctx`` (what the build
    passes, and ``env PKG``) the recipe's variables follow (``VLLM_TARGET_DEVICE``, ...) and the
    build venv comes first on PATH: everything the build gets. The checkout's date
    (:attr:`rocmforge.sources.checkout.Checkout.source_date_epoch`, its commit time) becomes
    ``SOURCE_DATE_EPOCH``, which setuptools, CMake, compilers (``__DATE__``/``__TIME__``) and
    our own wheel writer use instead of the clock. The package's ``env`` table is merged last,
    so a package can override anything. ``cache=False`` leaves the compile cache out
    (``CC``/``CXX`` name the real compilers): what a build's fingerprint and provenance record.
    """
    package = cfg.package(package_name)
    base = dict(facts.environ if base_env is None else base_env)
    backend = cfg.build.backend
    env: dict[str, str] = {}
    rocm_root = None
    path, ld_path, prefix = base.get("PATH"), base.get("LD_LIBRARY_PATH"), base.get("CMAKE_PREFIX_PATH")
    if backend == "rocm":
        rocm = rocm_for_build(cfg, facts)
        rocm_root = rocm.root
        env.update(ROCM_PATH=rocm.root, ROCM_HOME=rocm.root, HIP_PATH=rocm.root)
        # hipcc picks the NVIDIA platform when it sees nvcc on PATH; a ROCm build never wants that.
        env["HIP_PLATFORM"] = "amd"
        path = _prepend([os.path.join(rocm.root, "bin")], path)
        ld_path = _prepend([rocm.lib_dir], ld_path)
        prefix = _prepend([rocm.root], prefix)
        # The package's own list where it has one (aiter: gfx942;gfx950 only).
        env["PYTORCH_ROCM_ARCH"] = ";".join(require_package_archs(cfg, package))
        env.update(USE_ROCM="1", USE_CUDA="0")
    elif backend == "cuda":
        if not facts.cuda_home:
            raise UserError("build.backend is cuda but no CUDA found; set CUDA_HOME (e.g. /usr/local/cuda)")
        env["CUDA_HOME"] = facts.cuda_home
        path = _prepend([os.path.join(facts.cuda_home, "bin")], path)
        ld_path = _prepend([os.path.join(facts.cuda_home, "lib64")], ld_path)
        if cfg.build.cuda_arch:
            env["TORCH_CUDA_ARCH_LIST"] = ";".join(cfg.build.cuda_arch)
        env.update(USE_CUDA="1", USE_ROCM="0")
    else:
        env.update(USE_CUDA="0", USE_ROCM="0")
    for key, value in (("PATH", path), ("LD_LIBRARY_PATH", ld_path), ("CMAKE_PREFIX_PATH", prefix)):
        if value:
            env[key] = value
    jobs = str(parallel_jobs(cfg, package, facts))
    env.update(MAX_JOBS=jobs, CMAKE_BUILD_PARALLEL_LEVEL=jobs)
    cc, cxx = pick_compilers(package, facts)
    if cc:
        env["CC"] = cc
    if cxx:
        env["CXX"] = cxx
    env["CFLAGS"] = _flags(base.get("CFLAGS"), cfg.build.opt_level)
    env["CXXFLAGS"] = _flags(base.get("CXXFLAGS"), cfg.build.opt_level)
    if cache:
        compilers = {"CC": cc, "CXX": cxx}
        env.update(compile_cache.launcher_env(cfg, facts, compilers=compilers, rocm_root=rocm_root))
    epoch = getattr(ctx.checkout, "source_date_epoch", None) if ctx is not None else None
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(epoch)
    if ctx is not None:
        env.update(recipes.get(package.recipe).environment(ctx, {**base, **env}))
        # The venv's tools (cmake, ninja from the build requirements) run before the host's.
        venv = ctx.python.parent.parent
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = _prepend([str(venv / "bin")], env.get("PATH", base.get("PATH")))
    env.update(package.env)
    return env


def shell_lines(env: Mapping[str, str]) -> list[str]:
    """``export KEY='value'`` lines a POSIX shell can eval."""
    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
