"""Benchmark: fresh clone vs. rocmforge re-checkout of an unchanged pin vs. a pin bump.

Builds an upstream with history (``--files`` files, ``--commits`` commits, each touching
``--touch`` files) and a submodule, serves it with a real ``git daemon`` on 127.0.0.1 and
times, ``--runs`` times each (median, min, max):

- ``git clone --recurse-submodules`` at the pinned tag: what users do today;
- ``prepare`` into an empty cache: rocmforge's first checkout (shallow, by commit id);
- ``prepare`` of the unchanged pin, with the git daemon stopped: must need no network and
  write nothing but the lock holder line (files under third_party/ and the cache are compared);
- ``prepare`` after a pin bump to the next commit: objects fetched vs. a fresh clone's.

Usage: python scripts/bench_sources.py [--runs 5] [--files 3000] [--commits 30] [--touch 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gitrepos import GitDaemon, Upstream, commit, git, git_package, gitmodules, snapshot, write_config  # noqa: E402

from rocmforge.sources import checkout as sources  # noqa: E402
from rocmforge.sources import mirrors  # noqa: E402


def build_upstream(base: Path, files: int, commits: int, touch: int) -> tuple[Upstream, list[str]]:
    up = Upstream(base)
    lib = up.new("lib")
    lib_sha = commit(
        lib, {f"lib/{i}.c": f"int f{i}(void) {{ return {i}; }}\n" * 30 for i in range(200)}, "lib"
    )
    up.publish("lib")
    app = up.new("app")
    body = {f"src/{i // 100}/file{i}.cpp": f"// file {i}\n" + f"int v{i} = {i};\n" * 60 for i in range(files)}
    shas = [
        commit(
            app,
            {**body, ".gitmodules": gitmodules(("third_party/lib", "../lib.git"))},
            "initial",
            gitlinks={"third_party/lib": lib_sha},
        )
    ]
    for c in range(1, commits):
        touched = [(c * touch + k) % files for k in range(touch)]
        changed = {
            f"src/{i // 100}/file{i}.cpp": f"// file {i}, rev {c}\n" + f"int v{i} = {c};\n" * 60
            for i in touched
        }
        shas.append(commit(app, changed, f"change {c}"))
        git("tag", f"r{c}", cwd=app)
    up.publish("app")
    return up, shas


def objects(git_dir: Path) -> int:
    out = git("count-objects", "-v", cwd=git_dir)
    fields = dict(line.split(": ") for line in out.splitlines())
    return int(fields["count"]) + int(fields["in-pack"])


def measure(label: str, runs: int, once) -> dict:
    times, extra = [], []
    for _ in range(runs):
        seconds, info = once()
        times.append(seconds)
        extra.append(info)
    result = {"label": label, "median": statistics.median(times), "min": min(times), "max": max(times)}
    result["info"] = extra[0]
    print(
        f"{label:44s} median {result['median']:7.3f} s "
        f"(min {result['min']:.3f}, max {result['max']:.3f})  {extra[0]}"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--touch", type=int, default=50)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rocmforge-bench-"))
    try:
        up, shas = build_upstream(base / "up", args.files, args.commits, args.touch)
        daemon = GitDaemon(up.served)
        url = daemon.url("app")
        old_tag, new_tag = f"r{args.commits - 2}", f"r{args.commits - 1}"
        old, new = shas[-2], shas[-1]
        print(
            f"upstream: {args.files} files, {args.commits} commits, "
            f"{args.touch} files changed per commit, 1 submodule"
        )

        def clone():
            dest = base / "clone"
            shutil.rmtree(dest, ignore_errors=True)
            t = time.perf_counter()
            subprocess.run(
                ["git", "clone", "-q", "--recurse-submodules", "--branch", old_tag, url, str(dest)],
                check=True,
                capture_output=True,
            )
            seconds = time.perf_counter() - t
            return seconds, f"{objects(dest / '.git')} objects"

        def work(name: str, pin: str, tag: str):
            return write_config(base / name, git_package("app", url, tag, pin), cache=base / name / "cache")

        def first_checkout():
            shutil.rmtree(base / "first", ignore_errors=True)
            (base / "first").mkdir()
            cfg = work("first", old, old_tag)
            t = time.perf_counter()
            sources.prepare(cfg, "app")
            seconds = time.perf_counter() - t
            return seconds, f"{objects(mirrors.mirror_path(cfg.build.cache_dir, url))} objects in the mirror"

        shutil.rmtree(base / "same", ignore_errors=True)
        (base / "same").mkdir()
        same_cfg = work("same", old, old_tag)
        sources.prepare(same_cfg, "app")

        def unchanged():
            daemon.stop()  # a network access would now fail the run
            before = snapshot(base / "same" / "third_party", same_cfg.build.cache_dir, mtimes=True)
            t = time.perf_counter()
            sources.prepare(same_cfg, "app")
            seconds = time.perf_counter() - t
            after = snapshot(base / "same" / "third_party", same_cfg.build.cache_dir, mtimes=True)
            changed = sum(1 for k in after if after[k] != before.get(k)) + len(set(before) - set(after))
            return seconds, f"network stopped, {changed} files changed"

        def bump():
            nonlocal daemon
            if daemon.proc.poll() is not None:
                daemon = GitDaemon(up.served)
            shutil.rmtree(base / "bump", ignore_errors=True)
            (base / "bump").mkdir()
            # The daemon may have been restarted on a new port: configs use its current URL.
            cfg = write_config(
                base / "bump",
                git_package("app", daemon.url("app"), old_tag, old),
                cache=base / "bump" / "cache",
            )
            sources.prepare(cfg, "app")
            mirror = mirrors.mirror_path(cfg.build.cache_dir, daemon.url("app"))
            before = objects(mirror)
            cfg = write_config(
                base / "bump",
                git_package("app", daemon.url("app"), new_tag, new),
                cache=base / "bump" / "cache",
            )
            t = time.perf_counter()
            sources.prepare(cfg, "app")
            seconds = time.perf_counter() - t
            return seconds, f"{objects(mirror) - before} new objects fetched"

        results = [
            measure("git clone --recurse-submodules (baseline)", args.runs, clone),
            measure("rocmforge first checkout (empty cache)", args.runs, first_checkout),
            measure("rocmforge unchanged pin", args.runs, unchanged),
        ]
        results.append(measure("rocmforge pin bump (next commit)", args.runs, bump))
        base_median = results[0]["median"]
        for r in results[1:]:
            print(f"{r['label']:44s} {base_median / r['median']:8.1f}x faster than the clone")
        daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "200")
    sys.exit(main())
