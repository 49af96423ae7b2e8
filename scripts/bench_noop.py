"""Benchmark: a no-op run of the whole nine-package stack against a bare ``nox -l``.

The stack is ``build_config.toml``'s: its nine package names and its ``depends`` graph. The
machine here cannot build the real PyTorch, so each package is a small real project in a local
git repository: ``pytorch`` and ``triton`` are the minitorch/minitriton fixtures with the real
``pytorch`` and ``triton`` recipes (Triton's commit derived from the torch tree, as in
``examples/stack.toml``); the other seven are one-module setuptools projects built by the
generic recipe. The first run builds everything (a minute or two, once per ``--dir``); then,
``--runs`` times each, interleaved so that the load of a busy machine falls on all of them:

- bare ``nox -l``: nox listing a noxfile with one empty session (nox's own start-up, the floor);
- ``nox -l`` of rocmforge's noxfile (loads and validates the config);
- ``nox -s <the nine>``: every package "up to date" (checked in the output; anything else fails).

Reported: median, min and max of wall seconds and of CPU seconds (user + system of the child,
less sensitive to other processes on the machine), and the no-op's median minus bare ``nox -l``.

Usage: python scripts/bench_noop.py [--runs 7] [--dir DIR] [--noxfile PATH] [--json]
``--noxfile`` times another checkout's noxfile (say, an older commit's) on the same stack.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BARE_NOXFILE = '''import nox


@nox.session(venv_backend="none")
def noop(session):
    """Nothing."""
'''
# The two packages with fixture trees shaped like the real ones; the rest are generated.
FIXTURE_OF = {"pytorch": "minitorch", "triton": "minitriton"}


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stack_packages() -> dict[str, list[str]]:
    """Name -> depends of every package in the repository's ``build_config.toml``."""
    from rocmforge.config import tomllib

    data = tomllib.loads((ROOT / "build_config.toml").read_text())
    return {name: list(table.get("depends", [])) for name, table in data["packages"].items()}


def _pure_project(repo: Path, name: str) -> None:
    """A one-module setuptools project called ``name`` (a real sdist-free PEP 517 build)."""
    module = name.replace("-", "_")
    (repo / module).mkdir(parents=True)
    (repo / module / "__init__.py").write_text(f'"""Stand-in for {name} in the no-op benchmark."""\n')
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "1.0.0"\nrequires-python = ">=3.10"\n\n'
        f'[tool.setuptools]\npackages = ["{module}"]\n'
    )


def write_stack(base: Path) -> Path:
    """Repositories and a config for the nine-package stack under ``base``; the config's path."""
    make_repos = _load(EXAMPLES / "fixtures" / "make_repos.py")
    repos = base / "repos"
    config = base / "rocmforge.toml"
    if config.is_file():
        return config
    commits: dict[str, str] = {}
    for fixture in ("minitriton", "minitorch"):
        pins = {p: commits[o] for p, o in make_repos.COMMIT_PINS.get(fixture, {}).items()}
        commits[fixture] = make_repos.make_repo(fixture, repos, pins)
    lines = [
        "# The nine packages of build_config.toml with its depends graph, as small local projects.",
        '[toolchain]\nrocm_version = "5.2"\n',
        '[build]\nbackend = "rocm"\narch = ["gfx90a"]\njobs = 2\nwork_dir = "out"',
        'wheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\nthird_party = "out/third_party"\n',
    ]
    for name, depends in stack_packages().items():
        lines.append(f"[packages.{name}]\ndepends = {json.dumps(depends)}")
        if name == "pytorch":
            lines.append('recipe = "pytorch"\nversion = "0.1.0"\nlocal_version = "rocm5.2"')
            lines.append("options = { rocm_libraries = false }")
        elif name == "triton":
            lines.append('recipe = "triton"\nversion = "0.3.0"\npin_from = "pytorch"')
        else:
            repo = repos / name
            _pure_project(repo, name)
            for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", name]):
                subprocess.run(["git", *argv], cwd=repo, check=True, env=make_repos._IDENTITY)
        url = (repos / FIXTURE_OF.get(name, name)).as_uri()
        rev = "v1.0.0" if name == "pytorch" else "main"  # triton: its commit comes from the torch tree
        lines.append(f'[packages.{name}.source]\nkind = "git"\nurl = "{url}"\nrev = "{rev}"\n')
    config.write_text("\n".join(lines) + "\n")
    return config


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(wall seconds, child CPU seconds, combined output) of one run; a failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.exit(f"bench_noop: {' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
    return wall, cpu, proc.stdout + proc.stderr


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dir", type=Path, help="keep the built stack here (reused on the next run)")
    parser.add_argument("--noxfile", type=Path, default=ROOT / "noxfile.py", help="the noxfile to time")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    base = args.dir or Path(tempfile.mkdtemp(prefix="rocmforge-noop-"))
    base.mkdir(parents=True, exist_ok=True)
    config = write_stack(base.resolve())
    bare = base / "bare"
    bare.mkdir(exist_ok=True)
    (bare / "noxfile.py").write_text(BARE_NOXFILE)
    names = list(stack_packages())
    # PYTHONDONTWRITEBYTECODE: a user's Python keeps bytecode caches; without them every run
    # would time compiling rocmforge's sources instead of running them.
    drop = ("PYTORCH_ROCM_ARCH", "MAX_JOBS", "ROCMFORGE_CONFIG", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(ROCMFORGE_CONFIG=str(config), COLUMNS="200")
    nox = [sys.executable, "-m", "nox"]
    noxfile = str(args.noxfile.resolve())

    start = time.monotonic()
    timed([*nox, "-f", noxfile, "-s", *names], env, base)  # builds whatever is missing
    print(f"stack ready in {time.monotonic() - start:.1f}s ({config})", file=sys.stderr)

    cases = {
        "bare nox -l": ([*nox, "-l"], bare),
        "rocmforge nox -l": ([*nox, "-f", noxfile, "-l"], base),
        f"no-op nox -s <{len(names)} packages>": ([*nox, "-f", noxfile, "-s", *names], base),
    }
    wall: dict[str, list[float]] = {case: [] for case in cases}
    cpu: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(args.runs):
        for case, (argv, cwd) in cases.items():
            w, c, out = timed(argv, env, cwd)
            if case.startswith("no-op"):
                done = out.count(": up to date (")
                if done != len(names):
                    sys.exit(f"bench_noop: expected {len(names)} 'up to date' lines, got {done}:\n{out}")
            wall[case].append(w)
            cpu[case].append(c)

    result = {
        "runs": args.runs,
        "packages": names,
        "noxfile": noxfile,
        "wall_s": {case: summary(v) for case, v in wall.items()},
        "cpu_s": {case: summary(v) for case, v in cpu.items()},
    }
    floor, _, noop = cases
    result["no-op minus bare nox -l (median wall s)"] = round(
        result["wall_s"][noop]["median"] - result["wall_s"][floor]["median"], 3
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'':<30} {'wall median':>11} {'min':>6} {'max':>6}   {'cpu median':>10} {'min':>6} {'max':>6}")
    for case in cases:
        w, c = result["wall_s"][case], result["cpu_s"][case]
        print(
            f"{case:<30} {w['median']:>11.3f} {w['min']:>6.3f} {w['max']:>6.3f}"
            f"   {c['median']:>10.3f} {c['min']:>6.3f} {c['max']:>6.3f}"
        )
    print(f"no-op minus bare nox -l (median wall): {result['no-op minus bare nox -l (median wall s)']:.3f}s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
