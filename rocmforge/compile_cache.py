"""The compile cache: sccache or ccache in front of every C, C++ and HIP compile.

``build.compile_cache`` picks the tool and where it stores objects: a local directory, or a
store several builders share (Redis, S3 or GCS with sccache; Redis with ccache). The cache is
wired in through the compiler-launcher variables, which CMake reads from the environment
**only on the first configure of a build directory**: after changing the launcher, start from
a clean build directory or the old setting stays in ``CMakeCache.txt``.

HIP device code goes through the same cache twice over: CMake's HIP language (vLLM) takes
``CMAKE_HIP_COMPILER_LAUNCHER``, and hipcc (PyTorch, which calls it with absolute paths past
the CMake launchers) runs clang through ``HIP_CLANG_LAUNCHER`` from ROCm 7.13 on.

``launcher_env`` is pure (config + host facts -> variables) and merged into the build
environment by ``buildenv``; ``zero_stats`` before a build and ``stats`` after it are what a
build prints. ``python -m rocmforge cache stats|zero`` does the same by hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from rocmforge.config import Config
from rocmforge.errors import UserError
from rocmforge.fsutil import json_sha256
from rocmforge.hints import install_hint
from rocmforge.host import probe_os_id

# hipcc runs "<HIP_CLANG_LAUNCHER> <clang> ..." from this ROCm on (ROCm/llvm-project#1490);
# older hipcc ignores the variable, so setting it there would only mislead.
HIP_CLANG_LAUNCHER_SINCE = Version("7.13")
# The languages CMake compiles per backend; the cache goes in front of each.
LAUNCHER_LANGUAGES = {"rocm": ("C", "CXX", "HIP"), "cuda": ("C", "CXX", "CUDA"), "cpu": ("C", "CXX")}
_LAUNCHER_VARIABLES = frozenset(
    {f"CMAKE_{lang}_COMPILER_LAUNCHER" for langs in LAUNCHER_LANGUAGES.values() for lang in langs}
    | {"HIP_CLANG_LAUNCHER"}
)
# sccache serves one configuration per server; a port per store keeps a server started for one
# store from silently serving a build configured for another (it ignores the new variables).
_PORT_BASE, _PORT_SPAN = 10000, 20000
_REDIS_DB_RE = re.compile(r"^[a-z+]+://[^/]+/([0-9]+)/?$")
_PASSWORD_RE = re.compile(r"(://[^:/@\s]*:)\S+@")


@dataclass(frozen=True)
class CacheStats:
    """What the cache did since its counters were last zeroed."""

    tool: str
    location: str  # where the tool says it stores, e.g. "Local disk: /x" or "redis://host"
    hits: int
    misses: int
    uncacheable: int  # compiles the tool had to pass through (links, unsupported flags, ...)
    errors: int  # failed reads/writes of the store: a shared store that is down shows here
    raw: Mapping[str, Any] = field(repr=False)  # the tool's own statistics, as it reported them

    @property
    def hit_rate(self) -> float | None:
        """Hits among cacheable compiles (0..1), or None before the first compile."""
        total = self.hits + self.misses
        return self.hits / total if total else None

    def summary(self) -> str:
        """One line for the end of a build log."""
        rate = "no cacheable compiles" if self.hit_rate is None else f"{self.hit_rate:.0%} hit rate"
        text = f"{self.tool} ({self.location}): {self.hits} hits, {self.misses} misses, {rate}"
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


def launcher_env(cfg: Config, facts: Any) -> dict[str, str]:
    """The variables that put ``build.compile_cache`` in front of every compile (pure).

    ``facts`` is ``host.HostFacts`` or a mapping ``{"sccache": path, "ccache": path,
    "rocm_version": "7.2"}`` (a missing ROCm version falls back to ``toolchain.rocm_version``).
    Empty when the cache is off. Raises ``UserError`` when the chosen tool is not on PATH.
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
    store = cfg.build.cache_store
    languages = [lang for lang in LAUNCHER_LANGUAGES[cfg.build.backend] if store.hip or lang != "HIP"]
    env = {f"CMAKE_{lang}_COMPILER_LAUNCHER": exe for lang in languages}
    if "HIP" in languages:
        rocm = _rocm_version(cfg, facts)
        if rocm is not None and rocm >= HIP_CLANG_LAUNCHER_SINCE:
            env["HIP_CLANG_LAUNCHER"] = exe
    env.update(_sccache_env(cfg) if tool == "sccache" else _ccache_env(cfg))
    return env


def is_cache_variable(name: str) -> bool:
    """Whether ``name`` is one that :func:`launcher_env` sets or the cache tools read.

    A cache serves the objects the compiler would have made, so these variables must not
    change a build's fingerprint, and they stay out of the provenance inside wheels: a store's
    endpoint can carry a password.
    """
    return name.startswith(("SCCACHE_", "CCACHE_")) or name in _LAUNCHER_VARIABLES


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


def _rocm_version(cfg: Config, facts: Any) -> Version | None:
    """The ROCm whose hipcc the build will run (the one buildenv selects), else the pinned one."""
    text = facts.get("rocm_version") if isinstance(facts, Mapping) else facts.rocm_version
    text = text or cfg.rocm_version
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


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
    exe = env.get("CMAKE_C_COMPILER_LAUNCHER") or tool  # the binary the build itself runs
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


def stats(cfg: Config, env: Mapping[str, str] | None = None) -> CacheStats | None:
    """The cache's counters since ``zero_stats`` (None when the cache is off).

    ``env`` is the build environment (it names the store and sccache's server); by default
    the process environment merged with :func:`launcher_env` for the tools on PATH.
    """
    tool = cfg.build.compile_cache
    if tool == "none":
        return None
    if env is None:
        env = {**os.environ, **launcher_env(cfg, _tools_on_path())}
    if tool == "sccache":
        return _sccache_stats(json.loads(_run(cfg, env, "--show-stats", "--stats-format", "json")))
    return _ccache_stats(_run(cfg, env, "--print-stats"), describe(cfg))


def stats_line(cfg: Config, env: Mapping[str, str]) -> str | None:
    """The line a finished build prints: the statistics, or why there are none (never raises)."""
    try:
        result = stats(cfg, env)
    except UserError as exc:  # a finished build must not fail over its statistics
        return f"{cfg.build.compile_cache} statistics unavailable: {exc}"
    return result.summary() if result else None


def _sccache_stats(data: Mapping[str, Any]) -> CacheStats:
    s = data["stats"]
    return CacheStats(
        tool="sccache",
        location=_redact(data.get("cache_location", "")),
        hits=sum(s["cache_hits"]["counts"].values()),
        misses=sum(s["cache_misses"]["counts"].values()),
        uncacheable=s["requests_not_cacheable"] + s["requests_unsupported_compiler"],
        errors=s["cache_read_errors"] + s["cache_write_errors"] + s["cache_timeouts"],
        raw=data,
    )


def _ccache_stats(text: str, location: str) -> CacheStats:
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
    )


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
