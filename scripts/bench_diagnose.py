#!/usr/bin/env python3
"""How long ``rocmforge diagnose`` takes on a long build log, against a plain Python line loop.

Generates a build log of the given size (a PyTorch-like ROCm build: ninja progress lines,
verbose hipcc command lines with ``-Wno-error=...`` and ``-fPIC``, clang warnings with their
source excerpts, CMake status lines, coloured diagnostics and a few ``\\r`` progress redraws),
ending in the compiler killed for lack of memory, then times, in fresh processes, several runs of

    baseline   ``for line in open(log, "rb"): pass`` (reading the lines, nothing else)
    diagnose   ``rocmforge.diagnose.engine.diagnose_file(log)``

and reports medians, the ratio, and each process's peak memory (ru_maxrss) on the small and the
large log: memory that stays flat does not grow with the log.

    python scripts/bench_diagnose.py --mb 200 --runs 3 [--small-mb 20] [--keep DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# One child process per run, so each run's peak memory is its own; it prints seconds and KiB.
_CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
mode, log = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if mode == "baseline":
    with open(log, "rb") as f:
        for line in f:
            pass
    result = ""
else:
    from rocmforge.diagnose.engine import diagnose_file
    d = diagnose_file(log)
    result = f"{{d.category}} line {{d.evidence[0].line if d.evidence else '-'}}"
seconds = time.perf_counter() - start
print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, result, sep="\\t")
"""


def _lines(i: int) -> list[str]:
    """The lines one compile step of a big ROCm build prints (varied by the step number)."""
    obj = f"caffe2/CMakeFiles/torch_hip.dir/__/aten/src/ATen/native/hip/Kernel{i % 4000}.hip.o"
    src = f"/src/pytorch/aten/src/ATen/native/hip/Kernel{i % 4000}.hip"
    out = [f"[{i}/250000] Building HIP object {obj}"]
    if i % 3 == 0:
        out.append(
            "/opt/rocm-7.2.0/lib/llvm/bin/clang++ -DUSE_ROCM -D__HIP_PLATFORM_AMD__=1 "
            "-DTORCH_HIP_BUILD_MAIN_LIB "
            "-I/src/pytorch/build/aten/src -I/src/pytorch/aten/src -I/opt/rocm-7.2.0/include "
            "-isystem /src/pytorch/third_party/protobuf/src -Wno-error=maybe-uninitialized "
            "-Wno-error=deprecated-declarations -Wno-unused-parameter -fPIC -O3 -DNDEBUG -std=c++17 "
            f"--offload-arch=gfx90a --offload-arch=gfx942 -x hip -MD -MT {obj} -MF {obj}.d -o {obj} -c {src}"
        )
    if i % 4 == 0:
        out += [
            "In file included from /src/pytorch/aten/src/ATen/native/hip/Loops.cuh:5:",
            f"\x1b[1m{src}:87:5: \x1b[0;1;35mwarning: \x1b[0mloop not unrolled: the optimizer was unable "
            "to perform the requested transformation [-Wpass-failed=transform-warning]\x1b[0m",
            "   87 |     for (int i = 0; i < N; ++i) { out[i] = static_cast<T>(in[i]) * alpha; }",
            "      |     ^",
        ]
    if i % 50 == 0:
        out.append(f"-- Performing Test HAS_WNO_UNUSED_{i} - Success")
    if i % 997 == 0:
        out.append("Downloading 10%\rDownloading 55%\rDownloading 100%")
    return out


_TAIL = [
    "FAILED: caffe2/CMakeFiles/torch_hip.dir/__/aten/src/ATen/native/hip/Reduce.hip.o",
    "clang++: error: unable to execute command: Killed",
    "c++: fatal error: Killed signal terminated program cc1plus",
    "compilation terminated.",
    "ninja: build stopped: subcommand failed.",
]


def generate(path: Path, megabytes: int) -> int:
    """Write a build log of about ``megabytes`` MB that ends in an OOM kill; return its lines."""
    target = megabytes * 1_000_000
    size = lines = i = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("MAX_JOBS=64\n-- The CXX compiler identification is GNU 13.3.0\n")
        while size < target:
            batch = [line for j in range(i, i + 2000) for line in _lines(j)]
            i += 2000
            text = "\n".join(batch) + "\n"
            f.write(text)
            size += len(text.encode())
            lines += len(batch)
        f.write("\n".join(_TAIL) + "\n")
    return lines + len(_TAIL) + 2


def run(mode: str, log: Path) -> tuple[float, int, str]:
    """(seconds, peak KiB, result) of one run in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(root=str(ROOT)), mode, str(log)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, kib, result = proc.stdout.rstrip("\n").split("\t")
    return float(seconds), int(kib), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the large log (MB)")
    parser.add_argument("--small-mb", type=int, default=20, help="size of the small log (MB), for memory")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the logs here and keep them")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        report: dict[str, dict[str, object]] = {}
        for label, mb in (("small", args.small_mb), ("large", args.mb)):
            log = where / f"build-{mb}mb.log"
            if not log.exists():
                start = time.perf_counter()
                n = generate(log, mb)
                print(
                    f"generated {log} ({log.stat().st_size / 1e6:.0f} MB, {n} lines) in "
                    f"{time.perf_counter() - start:.1f} s"
                )
            entry: dict[str, object] = {"bytes": log.stat().st_size}
            for mode in ("baseline", "diagnose"):
                runs = [run(mode, log) for _ in range(args.runs)]
                entry[mode] = {
                    "seconds": [r[0] for r in runs],
                    "median_s": statistics.median(r[0] for r in runs),
                    "peak_kib": max(r[1] for r in runs),
                    "result": runs[0][2],
                }
            report[label] = entry
            base, diag = entry["baseline"], entry["diagnose"]
            ratio = diag["median_s"] / base["median_s"]
            print(
                f"{label} {entry['bytes'] / 1e6:.0f} MB: baseline {base['median_s']:.2f} s "
                f"(peak {base['peak_kib'] / 1024:.0f} MiB), diagnose {diag['median_s']:.2f} s "
                f"(peak {diag['peak_kib'] / 1024:.0f} MiB, {ratio:.1f}x the loop) "
                f"-> {diag['result']}; runs {', '.join(f'{s:.2f}' for s in diag['seconds'])}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
