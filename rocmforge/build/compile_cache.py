"""The compile cache: sccache or ccache in front of every C, C++ and HIP compile of a build.

``build.compile_cache`` picks the tool and where it stores objects: a local directory, or a
store several builders share (Redis, S3 or GCS with sccache; Redis with ccache). Builds reach
the cache three ways, all set up by :func:`launcher_env` and :func:`install_wrappers`:

- ``CC``/``CXX`` name small wrapper scripts (``<cache_dir>/compile-cache-wrappers/<tool>/bin``)
  that run each compile through the tool with the real compiler: setuptools, distutils,
  ``torch.utils.cpp_extension``'s ninja files and CMake (which takes ``CC``/``CXX`` on the first
  configure of a build directory) all call them.
- ``HIP_CLANG_PATH`` names a directory of wrappers for the ROCm's own clang: hipcc (the perl
  script of ROCm 5.x as well as the binary of ROCm 6/7) runs ``$HIP_CLANG_PATH/clang++``, so
  PyTorch's and every extension's HIP device code is cached although hipcc calls its clang by
  absolute path. ``CMAKE_HIP_COMPILER_LAUNCHER`` covers CMake's HIP language (vLLM).
- A compiler a wrapper stands for is identified by more than its path: the HIP wrappers add a
  digest of the real clang, the LLVM libraries it loads and the ROCm device libraries to every
  key (the offload archs are on the command line, which both tools hash), so an object built
  by another ROCm, or for other GPUs, is never returned.

The wrappers log each compile they see (``ROCMFORGE_CACHE_LOG``); with the tool's counters
that makes the per-build statistics: compiles seen, cacheable, hits per language, and what
bypassed the cache. :func:`begin` before a build and :func:`finish` after it;
``python -m rocmforge cache stats|zero`` shows or zeroes the tool's counters by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rocmforge.config import Config
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, file_sha256, json_sha256, read_json
from rocmforge.hints import install_hint
from rocmforge.host import probe_os_id

# The languages CMake compiles per backend; CC/CXX wrappers cover C and C++, a launcher the rest.
LAUNCHER_LANGUAGES = {"rocm": ("C", "CXX", "HIP"), "cuda": ("C", "CXX", "CUDA"), "cpu": ("C", "CXX")}
# What the wrappers stand for, for install_wrappers; cache variables, so never in a fingerprint.
TOOL_VAR, LOG_VAR, ROCM_VAR = "ROCMFORGE_CACHE_TOOL", "ROCMFORGE_CACHE_LOG", "ROCMFORGE_CACHE_ROCM"
REAL_VARS = {"CC": "ROCMFORGE_CACHE_CC", "CXX": "ROCMFORGE_CACHE_CXX"}
WRAPPER_DIR = "compile-cache-wrappers"
# CMake runs "<launcher> <compiler> ...": one launcher for C/C++, one that keys HIP compiles.
LAUNCHER, HIP_LAUNCHER = "launcher", "hip-launcher"
_CACHE_VARIABLES = frozenset(
    {f"CMAKE_{lang}_COMPILER_LAUNCHER" for langs in LAUNCHER_LANGUAGES.values() for lang in langs}
    | {"HIP_CLANG_LAUNCHER"}
)
# The names hipcc runs from HIP_CLANG_PATH: clang++/clang (ROCm 6+), clang++-15 (Debian's perl hipcc).
_CLANG_NAME = re.compile(r"clang(\+\+)?(-[0-9]+)?")
# sccache serves one configuration per server; a port per store keeps a server started for one
# store from silently serving a build configured for another (it ignores the new variables).
_PORT_BASE, _PORT_SPAN = 10000, 20000
_REDIS_DB_RE = re.compile(r"^[a-z+]+://[^/]+/([0-9]+)/?$")
_PASSWORD_RE = re.compile(r"(://[^:/@\s]*:)\S+@")
LANGUAGE_NAMES = {"c": "C", "c++": "C++", "hip": "HIP", "cuda": "CUDA"}
_Calls = Mapping[str, Mapping[str, int]]  # route ("cached", "bypassed") -> language -> count


@dataclass(frozen=True)
class CacheStats:
    """What the cache did since its counters were last zeroed, and what the wrappers saw."""

    tool: str
    location: str  # where the tool says it stores, e.g. "Local disk: /x" or "redis://host"
    hits: int
    misses: int
    uncacheable: int  # compiles the tool had to pass through (links, unsupported flags, ...)
    errors: int  # failed reads/writes of the store: a shared store that is down shows here
    raw: Mapping[str, Any] = field(repr=False)  # the tool's own statistics, as it reported them
    # language ("C", "C++", "HIP") -> {"hits": n, "misses": n}, as the tool counted them
    by_language: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # what the wrappers saw: "cached" (sent to the tool) and "bypassed" (compiled and linked
    # in one call, which no cache can store) -> language -> count; empty without a call log
    calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float | None:
        """Hits among cacheable compiles (0..1), or None before the first compile."""
        total = self.hits + self.misses
        return self.hits / total if total else None

    @property
    def seen(self) -> int:
        """Compiles the wrappers saw (0 without a call log)."""
        return sum(sum(langs.values()) for langs in self.calls.values())

    @property
    def bypassed(self) -> int:
        """Compiles that never reached the cache: compile and link in one call."""
        return sum(self.calls.get("bypassed", {}).values())

    def summary(self) -> str:
        """One line for the end of a build log."""
        rate = "no cacheable compiles" if self.hit_rate is None else f"{self.hit_rate:.0%} hit rate"
        text = f"{self.tool} ({self.location}): {self.hits} hits, {self.misses} misses, {rate}"
        # hits/cacheable per language, e.g. "(C 3/3, C++ 9/9, HIP 1/1)"
        langs = [f"{lang} {c['hits']}/{c['hits'] + c['misses']}" for lang, c in self.by_language.items()]
        if any(c["hits"] + c["misses"] for c in self.by_language.values()):
            text += " (" + ", ".join(x for x in langs if not x.endswith("/0")) + ")"
        if self.calls:
            text += f"; {self.seen} compiles seen"
            if self.bypassed:
                langs = ", ".join(f"{lang} {n}" for lang, n in self.calls["bypassed"].items())
                text += f", {self.bypassed} bypassed the cache (compile and link in one call: {langs})"
        if self.uncacheable:
            text += f", {self.uncacheable} not cacheable"
        if self.errors:
            text += f", {self.errors} store errors"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain values for ``--json`` output."""
        data = asdict(self)
        data["raw"] = dict(self.raw)
        data["hit_rate"] = self.hit_rate
        return data

    def to_record(self) -> dict[str, Any]:
        """What a wheel's provenance keeps: the counts, not the tool's raw dump."""
        data = {k: v for k, v in self.to_dict().items() if k != "raw"}
        data.update(seen=self.seen, bypassed=self.bypassed)
        return data


def launcher_env(
    cfg: Config,
    facts: Any,
    *,
    compilers: Mapping[str, str | None] | None = None,
    rocm_root: str | None = None,
) -> dict[str, str]:
    """The variables that put ``build.compile_cache`` in front of every compile (pure).

    ``facts`` is ``host.HostFacts`` or a mapping ``{"sccache": path, "ccache": path}``;
    ``compilers`` the build's ``{"CC": ..., "CXX": ...}`` (wrapped when they are one command;
    else CMake's launchers cover them); ``rocm_root`` the ROCm whose clang hipcc runs. Empty when
    the cache is off. Raises ``UserError`` when the chosen tool is not on PATH. The wrappers
    these variables name are written by :func:`install_wrappers`.
    """
    tool = cfg.build.compile_cache
    if tool == "none":
        return {}
    exe = _tool_path(tool, facts)
    if not exe:
        raise UserError(
            f"build.compile_cache: {tool} is not on PATH; {install_hint(tool, probe_os_id())}, "
            'or set compile_cache = "none"'
        )
    store, backend, bindir = cfg.build.cache_store, cfg.build.backend, wrapper_dir(cfg) / "bin"
    env = {TOOL_VAR: exe}
    for var, lang in (("CC", "C"), ("CXX", "CXX")):
        command = (compilers or {}).get(var)
        # A command line in CC ("ccache gcc") is the user's own wrapper: left alone.
        if command and not any(c.isspace() for c in command) and "/" not in Path(command).name:
            env[var] = str(bindir / Path(command).name)
            env[REAL_VARS[var]] = command
        # Also for CMake projects that set their own compiler; in front of a CC/CXX wrapper the
        # launcher only runs the wrapper, so nothing is cached twice.
        env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = str(bindir / LAUNCHER)
    if backend == "cuda":
        env["CMAKE_CUDA_COMPILER_LAUNCHER"] = exe
    if backend == "rocm" and store.hip:
        env["CMAKE_HIP_COMPILER_LAUNCHER"] = str(bindir / HIP_LAUNCHER)
        if rocm_root:
            env["HIP_CLANG_PATH"] = str(hip_clang_dir(cfg, rocm_root))
            env[ROCM_VAR] = rocm_root
            # hipcc >= 7.13 would run a launcher of the user's in front of the wrapper: twice cached.
            env["HIP_CLANG_LAUNCHER"] = ""
    env.update(_sccache_env(cfg) if tool == "sccache" else _ccache_env(cfg))
    return env


def wrapper_dir(cfg: Config) -> Path:
    """Where the tool's wrappers live: ``<build.cache_dir>/compile-cache-wrappers/<tool>``."""
    return cfg.build.cache_dir / WRAPPER_DIR / cfg.build.compile_cache


def hip_clang_dir(cfg: Config, rocm_root: str) -> Path:
    """The ``HIP_CLANG_PATH`` of a ROCm's wrappers (one directory per ROCm root)."""
    digest = hashlib.sha256(os.path.realpath(rocm_root).encode()).hexdigest()[:12]
    return wrapper_dir(cfg) / "hip" / digest / "bin"


# One script serves as a compiler wrapper (``real`` fixed) and as a launcher (``real`` = $1).
# It sends compiles (-c) through the tool with the real compiler, so that the tool hashes the
# real binary; version queries, links and -E run the compiler directly. A source compiled and
# linked in one call cannot be cached by either tool: it is logged as "bypassed".
_SCRIPT = """#!/bin/sh
# Written by rocmforge (rocmforge/build/compile_cache.py) at the start of each build; do not edit.
{note}{real}
{identity}compile= pre= src= lang= skip=
for a do
  if [ -n "$skip" ]; then
    [ "$skip" = x ] && lang=$a
    skip=; continue
  fi
  case $a in
    -c) compile=1 ;;
    -E|-M|-MM|-fsyntax-only) pre=1 ;;
    -x) skip=x ;;
    -x*) lang=${{a#-x}} ;;
    -o|-MF|-MT|-MQ|-I|-D|-U|-include|-isystem|-Xclang|-Xlinker|-mllvm|-L) skip=1 ;;
    -*) ;;
    *.c) src=${{src:-${{lang:-c}}}} ;;
    *.cc|*.cp|*.cpp|*.cxx|*.CPP|*.C|*.c++) src=${{src:-${{lang:-c++}}}} ;;
    *.cu|*.hip) src=${{src:-${{lang:-hip}}}} ;;
  esac
done
if [ -n "$src" ] && [ -z "$pre" ]; then
  route=bypassed
  [ -n "$compile" ] && route=cached
  if [ -n "$ROCMFORGE_CACHE_LOG" ]; then
    printf '%s %s\\n' "$route" "$src" >> "$ROCMFORGE_CACHE_LOG"
{statslog}  fi
  [ "$route" = cached ] && exec {tool} "$real" "$@"
fi
exec "$real" "$@"
"""


# A launcher in front of one of the wrappers (CMake with CC=<wrapper>) leaves the caching to it.
_LAUNCHER_HEAD = """real=$1; shift
case $real in {root}/*) exec "$real" "$@" ;; esac"""


def install_wrappers(cfg: Config, env: Mapping[str, str]) -> None:
    """Write the wrappers that ``env`` (from :func:`launcher_env`) names; a no-op without them.

    Real compilers are looked up on the build's PATH (without the wrappers' own directory).
    Raises ``UserError`` when a compiler or the ROCm's clang is missing, before any build starts.
    """
    if cfg.build.compile_cache == "none" or TOOL_VAR not in env:
        return
    tool, exe, root = cfg.build.compile_cache, env[TOOL_VAR], wrapper_dir(cfg)
    bindir = root / "bin"
    search = os.pathsep.join(
        p for p in env.get("PATH", os.environ.get("PATH", "")).split(os.pathsep) if Path(p) != bindir
    )
    with file_lock(wrapper_dir(cfg) / ".lock", what="writing compile-cache wrappers"):
        scripts: dict[Path, str] = {}
        for var, real_var in REAL_VARS.items():
            if real_var in env:
                real = shutil.which(env[real_var], path=search)
                if real is None:
                    raise UserError(f"{var}={env[real_var]} is not on PATH; install it or set {var}")
                # The compiler's digest in the script: a build that puts its own ccache in
                # front of CC (mori's setup.py does) keys on the wrapper, which then changes
                # with the compiler.
                digest = _digest(cfg, [real])
                scripts[Path(env[var])] = _script(tool, exe, root, real=real, digest=digest)
        clangs: dict[str, str] = {}
        if ROCM_VAR in env:
            rocm, real_dir = env[ROCM_VAR], rocm_clang_dir(env[ROCM_VAR])
            names = sorted(n for n in os.listdir(real_dir) if _CLANG_NAME.fullmatch(n))
            clangs = {n: os.path.join(real_dir, n) for n in names}
            for name, real in clangs.items():
                identity = hip_identity(cfg, real, rocm)
                scripts[Path(env["HIP_CLANG_PATH"]) / name] = _script(
                    tool, exe, root, real=real, identity=identity
                )
            _link(Path(env["HIP_CLANG_PATH"]).parent / "lib", os.path.join(real_dir, os.pardir, "lib"))
        if "CMAKE_HIP_COMPILER_LAUNCHER" in env:
            # CMake names its HIP compiler per call; key on the ROCm's own clang++ and device libs.
            main = clangs.get("clang++") or next(iter(clangs.values()), None)
            identity = hip_identity(cfg, main, env[ROCM_VAR]) if main else "hip"
            scripts[Path(env["CMAKE_HIP_COMPILER_LAUNCHER"])] = _script(tool, exe, root, identity=identity)
        for lang in ("C", "CXX"):
            if env.get(f"CMAKE_{lang}_COMPILER_LAUNCHER", "").startswith(str(bindir)):
                scripts[Path(env[f"CMAKE_{lang}_COMPILER_LAUNCHER"])] = _script(tool, exe, root)
        for path, text in scripts.items():
            if not path.is_file() or path.read_text() != text:
                atomic_write(path, text, mode=0o755)


def _link(link: Path, target: str) -> None:
    """``link`` -> ``target``, replaced in one rename. Debian's hipcc finds clang's headers and
    runtime as ``$HIP_CLANG_PATH/../lib/clang``, so the wrappers' directory needs that ``lib``."""
    if link.is_symlink() and os.readlink(link) == target:
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _script(
    tool: str,
    exe: str,
    root: Path,
    *,
    real: str | None = None,
    identity: str | None = None,
    digest: str | None = None,
) -> str:
    """A wrapper (``real`` given) or a launcher; ``identity`` marks a HIP compiler, ``digest``
    is the real compiler's (both end up in the script's text)."""
    lines = []
    if identity and tool == "sccache":
        lines.append(f'SCCACHE_C_CUSTOM_CACHE_BUSTER="${{SCCACHE_C_CUSTOM_CACHE_BUSTER}}{identity}"')
        lines.append("export SCCACHE_C_CUSTOM_CACHE_BUSTER")
    elif identity:
        # ccache's direct mode reads the -E output that --offload-compress compresses and then
        # misses header changes (stale objects, seen with ccache 4.7): always preprocess HIP.
        lines.append(f"CCACHE_COMPILERCHECK=string:{identity} CCACHE_NODIRECT=1")
        lines.append("export CCACHE_COMPILERCHECK CCACHE_NODIRECT")
    # ccache counts per call in CCACHE_STATSLOG; one file per language gives hits by language.
    statslog = '    CCACHE_STATSLOG="$ROCMFORGE_CACHE_LOG.ccache-$src"; export CCACHE_STATSLOG\n'
    return _SCRIPT.format(
        real=f"real={_sh_quote(real)}" if real else _LAUNCHER_HEAD.format(root=_sh_quote(str(root))),
        identity="".join(f"{line}\n" for line in lines),
        note=f"# compiler sha256 {digest}\n" if digest else "",
        statslog=statslog if tool == "ccache" else "",
        tool=_sh_quote(exe),
    )


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def rocm_clang_dir(rocm_root: str) -> str:
    """The directory hipcc runs clang from, as hipcc itself finds it (without HIP_CLANG_PATH)."""
    for sub in ("lib/llvm/bin", "llvm/bin", "bin"):
        path = os.path.join(rocm_root, sub)
        if os.path.isfile(os.path.join(path, "clang++")) or any(
            _CLANG_NAME.fullmatch(n) for n in (os.listdir(path) if os.path.isdir(path) else ())
        ):
            return path
    raise UserError(
        f"no clang under the ROCm at {rocm_root} for hipcc's compile cache; "
        "install ROCm's llvm (rocm-llvm) or set build.compile_cache.hip = false"
    )


def hip_identity(cfg: Config, clang: str, rocm_root: str) -> str:
    """A digest of what a HIP compile by ``clang`` depends on beyond its command line and source.

    The real clang binary, the LLVM/clang libraries next to it (Debian's clang is a small
    driver over libLLVM and libclang-cpp) and the ROCm's device libraries (bitcode linked into
    every kernel).
    """
    binary = os.path.realpath(clang)
    llvm_lib = os.path.join(os.path.dirname(os.path.dirname(binary)), "lib")
    files = {binary}
    files.update(str(p) for pat in ("libLLVM*.so*", "libclang-cpp*.so*") for p in Path(llvm_lib).glob(pat))
    files.update(str(p) for p in _device_libs(rocm_root, [llvm_lib]))
    return _digest(cfg, files)[:32]


def _digest(cfg: Config, files: Iterable[str]) -> str:
    """One digest of the files' contents; each file's own digest is remembered by size and
    mtime in the wrappers' directory, so a build start does not re-read a 100 MB libLLVM."""
    memo_path = wrapper_dir(cfg) / "identity.json"
    memo = read_json(memo_path) or {}
    digests = {}
    for path in sorted({os.path.realpath(f) for f in files if os.path.isfile(f)}):
        st = os.stat(path)
        key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
        if key not in memo:
            memo[key] = file_sha256(path)
        digests[path] = memo[key]
    atomic_write(memo_path, json.dumps(memo, indent=1, sort_keys=True))
    return json_sha256(digests)


def _device_libs(rocm_root: str, llvm_libs: Iterable[str]) -> list[Path]:
    """The device-library bitcode files of a ROCm (their layout moved between releases)."""
    roots = [Path(rocm_root, "amdgcn"), *Path(rocm_root, "lib").glob("*/amdgcn")]
    for lib in llvm_libs:
        roots += Path(lib, "clang").glob("*/lib/amdgcn")
    return sorted({bc for root in roots for bc in root.glob("**/*.bc")})


def is_cache_variable(name: str) -> bool:
    """Whether ``name`` is one that :func:`launcher_env` sets or the cache tools read.

    A cache serves the objects the compiler would have made, so these variables must not
    change a build's fingerprint, and they stay out of the provenance inside wheels: a store's
    endpoint can carry a password. (``CC``, ``CXX`` and ``HIP_CLANG_PATH`` name wrappers only in
    the environment a build runs with; its fingerprint takes the one without the cache.)
    """
    return name.startswith(("SCCACHE_", "CCACHE_", "ROCMFORGE_CACHE_")) or name in _CACHE_VARIABLES


def _sccache_env(cfg: Config) -> dict[str, str]:
    store = cfg.build.cache_store
    env = {
        # Checkouts at different paths (two builders, two worktrees) share entries (sccache >= 0.15);
        # sources and build trees may live outside the checkout (build.third_party, work_dir).
        "SCCACHE_BASEDIRS": os.pathsep.join(
            sorted({str(cfg.root), str(cfg.build.third_party), str(cfg.build.work_dir)})
        ),
        # A store that goes away mid-build must not fail a two-hour build: compile uncached.
        "SCCACHE_IGNORE_SERVER_IO_ERROR": "1",
    }
    if store.backend == "local":
        env["SCCACHE_DIR"] = str(local_dir(cfg))
        env["SCCACHE_CACHE_SIZE"] = store.size
        if cfg.build.backend == "rocm" and store.hip:
            # sccache's direct mode parses clang's -E output, which --offload-compress turns into
            # a compressed bundle (mozilla/sccache#2762, open for 0.16); it is a setting of the
            # whole server, hence part of the port below. Remote stores never use direct mode.
            env["SCCACHE_DIRECT"] = "false"
    elif store.backend == "redis":
        env["SCCACHE_REDIS_ENDPOINT"] = store.url or ""
        env["SCCACHE_REDIS_KEY_PREFIX"] = store.prefix
        # sccache (>= 0.8) ignores the database in the URL's path and reads it from here.
        if db := _REDIS_DB_RE.search(store.url or ""):
            env["SCCACHE_REDIS_DB"] = db[1]
    elif store.backend == "s3":
        env["SCCACHE_BUCKET"] = store.bucket or ""
        env["SCCACHE_S3_KEY_PREFIX"] = store.prefix
        if store.url:
            env["SCCACHE_ENDPOINT"] = store.url
        if store.region:
            env["SCCACHE_REGION"] = store.region
    else:  # gcs; sccache opens GCS read-only unless told otherwise
        env["SCCACHE_GCS_BUCKET"] = store.bucket or ""
        env["SCCACHE_GCS_KEY_PREFIX"] = store.prefix
        env["SCCACHE_GCS_RW_MODE"] = "READ_WRITE"
    env["SCCACHE_SERVER_PORT"] = str(_server_port(env))
    return env


def _ccache_env(cfg: Config) -> dict[str, str]:
    store = cfg.build.cache_store
    env = {
        # ccache keeps a local store in front of a remote one, so it always has a directory.
        "CCACHE_DIR": str(local_dir(cfg)),
        "CCACHE_MAXSIZE": store.size,
        # Share across checkout paths and build directories, and across builders whose compiler
        # binaries are identical but were installed at different times (the default is mtime).
        "CCACHE_BASEDIR": str(cfg.root),
        "CCACHE_NOHASHDIR": "true",
        "CCACHE_COMPILERCHECK": "content",
    }
    if store.backend == "redis":
        env["CCACHE_REMOTE_STORAGE"] = store.url or ""
    return env


def local_dir(cfg: Config) -> Path:
    """The directory of a local store (``build.compile_cache.dir``, else under ``cache_dir``)."""
    return cfg.build.cache_store.dir or cfg.build.cache_dir / cfg.build.compile_cache


def _server_port(store_env: Mapping[str, str]) -> int:
    digest = json_sha256(sorted(store_env.items()))
    return _PORT_BASE + int(digest[:8], 16) % _PORT_SPAN


def _tool_path(tool: str, facts: Any) -> str | None:
    if isinstance(facts, Mapping):
        return facts.get(tool)
    return getattr(facts, tool, None)


def describe(cfg: Config) -> str:
    """Where the cache stores, for humans; a password in a URL is masked."""
    store = cfg.build.cache_store
    if store.backend == "local":
        return f"local {local_dir(cfg)}"
    if store.backend == "redis":
        return f"redis {_redact(store.url or '')}"
    where = f"{store.backend}://{store.bucket}/{store.prefix}"
    return f"{where} at {_redact(store.url)}" if store.url else where


def _redact(text: str) -> str:
    """``text`` with the password of every URL in it masked (``redis://:***@host``)."""
    return _PASSWORD_RE.sub(r"\1***@", text)


def _run(cfg: Config, env: Mapping[str, str], *args: str) -> str:
    """Run the cache tool with the build's environment; failures are one-line user errors."""
    tool = cfg.build.compile_cache
    exe = env.get(TOOL_VAR) or tool  # the binary the build itself runs
    try:
        proc = subprocess.run(
            [exe, *args], env=dict(env), capture_output=True, text=True, timeout=120, check=False
        )
    except FileNotFoundError:
        how = install_hint(tool, probe_os_id())
        raise UserError(f"build.compile_cache: {exe} not found; {how}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UserError(
            f"{tool} with the store {describe(cfg)} failed: {why[0] if why else proc.returncode}; "
            f'check that the store is up, or set build.compile_cache = "none"'
        )
    return proc.stdout


def zero_stats(cfg: Config, env: Mapping[str, str]) -> None:
    """Start the cache (sccache's server, with the build's store) and zero its counters.

    Call before a build so that ``stats`` afterwards is about that build; an unreachable
    shared store is reported here, before hours of compiling, not after.
    """
    if cfg.build.compile_cache != "none":
        _run(cfg, env, "--zero-stats")


def begin(cfg: Config, env: Mapping[str, str], log: Path) -> dict[str, str]:
    """Prepare a build: write the wrappers, start an empty call log at ``log``, zero the counters.

    Returns ``env`` with the call log set; pass that to the build and to :func:`finish`.
    """
    if cfg.build.compile_cache == "none":
        return dict(env)
    install_wrappers(cfg, env)
    for old in [log, *log.parent.glob(f"{log.name}.ccache-*")]:
        old.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    env = {**env, LOG_VAR: str(log)}
    zero_stats(cfg, env)
    return env


def finish(cfg: Config, env: Mapping[str, str]) -> tuple[CacheStats | None, str | None]:
    """The statistics of a finished build and its line for the log (never raises).

    The line says why there are no statistics when the tool cannot give them; a finished
    build must not fail over its statistics.
    """
    try:
        result = stats(cfg, env)
    except UserError as exc:
        return None, f"{cfg.build.compile_cache} statistics unavailable: {exc}"
    return result, (result.summary() if result else None)


def stats(cfg: Config, env: Mapping[str, str] | None = None) -> CacheStats | None:
    """The cache's counters since ``zero_stats`` (None when the cache is off).

    ``env`` is the build environment (it names the store, sccache's server and the wrappers'
    call log); by default the process environment merged with :func:`launcher_env` for the
    tools on PATH.
    """
    tool = cfg.build.compile_cache
    if tool == "none":
        return None
    if env is None:
        env = {**os.environ, **launcher_env(cfg, _tools_on_path())}
    log = Path(env[LOG_VAR]) if env.get(LOG_VAR) else None
    calls = _read_calls(log) if log else {}
    if tool == "sccache":
        data = json.loads(_run(cfg, env, "--show-stats", "--stats-format", "json"))
        return _sccache_stats(data, calls)
    return _ccache_stats(_run(cfg, env, "--print-stats"), describe(cfg), calls, log)


def _read_calls(log: Path) -> dict[str, dict[str, int]]:
    """The wrappers' call log: route -> language -> count."""
    counts: dict[str, Counter] = {}
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return {}
    for line in text.splitlines():
        route, _, lang = line.partition(" ")
        if route in ("cached", "bypassed") and lang:
            counts.setdefault(route, Counter())[_language(lang)] += 1
    return {route: dict(sorted(c.items())) for route, c in sorted(counts.items())}


def _language(name: str) -> str:
    return LANGUAGE_NAMES.get(name.lower(), name)


def _sccache_stats(data: Mapping[str, Any], calls: _Calls | None = None) -> CacheStats:
    s = data["stats"]
    by_language: dict[str, dict[str, int]] = {}
    # adv_counts keys are "<language> [<compiler>]": "c [gcc]", "c++ [gcc]", "hip [clang]".
    for kind, counter in (("hits", "cache_hits"), ("misses", "cache_misses")):
        for key, n in s[counter].get("adv_counts", {}).items():
            lang = _language(key.split(" [", 1)[0])
            by_language.setdefault(lang, {"hits": 0, "misses": 0})[kind] += n
    return CacheStats(
        tool="sccache",
        location=_redact(data.get("cache_location", "")),
        hits=sum(s["cache_hits"]["counts"].values()),
        misses=sum(s["cache_misses"]["counts"].values()),
        uncacheable=s["requests_not_cacheable"] + s["requests_unsupported_compiler"],
        errors=s["cache_read_errors"] + s["cache_write_errors"] + s["cache_timeouts"],
        raw=data,
        by_language=dict(sorted(by_language.items())),
        calls=calls or {},
    )


def _ccache_stats(
    text: str, location: str, calls: _Calls | None = None, log: Path | None = None
) -> CacheStats:
    raw = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            raw[key] = int(value)
    # Everything ccache counts as "uncacheable" or "error", in its own words (ccache >= 4.4).
    uncacheable = (
        "autoconf_test",
        "bad_compiler_arguments",
        "called_for_link",
        "called_for_preprocessing",
        "multiple_source_files",
        "no_input_file",
        "output_to_stdout",
        "preprocessor_error",  # also clang -E of a device-only HIP compile for several archs
        "unsupported_code_directive",
        "unsupported_compiler_option",
        "unsupported_source_language",
    )
    return CacheStats(
        tool="ccache",
        location=location,
        hits=raw.get("direct_cache_hit", 0) + raw.get("preprocessed_cache_hit", 0),
        misses=raw.get("cache_miss", 0),
        uncacheable=sum(raw.get(k, 0) for k in uncacheable),
        errors=raw.get("remote_storage_error", 0) + raw.get("remote_storage_timeout", 0),
        raw=raw,
        by_language=_ccache_languages(log) if log else {},
        calls=calls or {},
    )


def _ccache_languages(log: Path) -> dict[str, dict[str, int]]:
    """Hits and misses per language from the per-language stats logs the wrappers asked for.

    ccache appends "# <source>" and then the counters it bumped, once per call.
    """
    result = {}
    for path in sorted(log.parent.glob(f"{log.name}.ccache-*")):
        counters = Counter(line.strip() for line in path.read_text(errors="replace").splitlines())
        hits = counters["direct_cache_hit"] + counters["preprocessed_cache_hit"]
        lang = _language(path.name.rsplit(".ccache-", 1)[1])
        result[lang] = {"hits": hits, "misses": counters["cache_miss"]}
    return result


def _tools_on_path() -> dict[str, str | None]:
    return {name: shutil.which(name) for name in ("sccache", "ccache")}


def add_arguments(parser) -> None:
    """``python -m rocmforge cache stats|zero``."""
    parser.add_argument("action", choices=("stats", "zero"), help="show or zero the counters")
    parser.add_argument("--json", action="store_true", help="stats as JSON (stdout)")


def main(args) -> int:
    """Show or zero the configured compile cache's statistics."""
    from rocmforge.config import load_config
    from rocmforge.console import console

    cfg = load_config()
    if cfg.build.compile_cache == "none":
        raise UserError('build.compile_cache is "none"; choose sccache or ccache to have statistics')
    env = {**os.environ, **launcher_env(cfg, _tools_on_path())}
    if args.action == "zero":
        zero_stats(cfg, env)
        console.print(f"{cfg.build.compile_cache}: statistics zeroed ({describe(cfg)})")
        return 0
    result = stats(cfg, env)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        console.print(result.summary())
    return 0
