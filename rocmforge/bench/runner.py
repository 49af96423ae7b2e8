"""``python -m rocmforge.bench``: what a torch/Triton/vLLM stack delivers on this GPU, against the
device's peak and, in A/B mode, against another environment.

It measures GEMM throughput (bf16, fp16, fp8 where the GPU has fp8 matrix units) on the weight
shapes of Llama-3 8B/70B projections at decode and prefill batch sizes, device memory bandwidth
(a large copy), a Triton matmul against torch's, and vLLM offline throughput of the tiny model
in ``examples/tiny-model`` with dummy weights (only where vLLM is installed).

The timed code runs in a worker process started with the measured environment's interpreter
(``--python``; A/B: ``--b-python``/``--b-env``), so rocmforge itself needs no torch. Timing:
device events around every call, a cache flush before each, warm-up first, medians over all
calls of several rounds; in A/B mode the rounds of A and B alternate (ABBA...) per case, and
ratios are A's speed over B's. Clocks are read with nvidia-smi or rocm-smi before and after
each section. Results: ``bench.json`` and ``bench.png`` in ``--out``.

Exit codes: 0 everything ran; 1 a case failed or a correctness check failed (see the JSON);
2 a usage error; 3 no GPU (no device node, or the environment's torch sees none).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rocmforge.bench import report as bench_report
from rocmforge.bench.peaks import lookup
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write

NO_GPU = 3
NO_GPU_NODE = "no GPU: this host has no /dev/kfd and no /dev/nvidia* device"
CASE_FAILED = 1
SECTIONS = ("gemm", "bandwidth", "triton", "vllm")
ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "examples" / "tiny-model"
WORKER = Path(__file__).with_name("worker.py")
MARK = "@@rocmforge-bench "  # prefix of the worker's answer lines; libraries print the rest
# Run the worker by path without putting rocmforge/bench/ on sys.path (a module of ours could shadow
# the standard library's); with -c, sys.path[0] is the working directory, the output folder.
BOOT = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"

# (N, K) weight shapes of Llama-3 projections: 8B (hidden 4096, MLP 14336), 70B (8192, 28672).
PROJECTIONS = (
    (14336, 4096, "8B gate/up"),
    (4096, 14336, "8B down"),
    (28672, 8192, "70B gate/up"),
    (8192, 28672, "70B down"),
)
DECODE_M, PREFILL_M = 16, 4096
SQUARE = 8192
COPY_BYTES = 2**30
# Offline throughput as vLLM's users run it (CUDA graphs on). The tiny model needs little memory;
# a third of the GPU keeps vLLM's start-up profiling short.
VLLM_SPEC = {
    "num_prompts": 256,
    "input_len": 128,
    "output_len": 128,
    "repeats": 3,
    "gpu_memory_utilization": 0.3,
    "enforce_eager": False,
}
VLLM_TIMEOUT_S = 1200
CLOCK_QUERY_TIMEOUT_S = 20
CLOCK_SAMPLE_MS = 250
NVIDIA_SMI_FIELDS = (
    "timestamp",
    "index",
    "name",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "pstate",
)


@dataclass(frozen=True)
class Env:
    """One measured environment: an interpreter and the variables set for it."""

    name: str  # "A" or "B"
    python: str
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return " ".join([self.python, *(f"{k}={v}" for k, v in self.overrides)])

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, **dict(self.overrides), "PYTHONUNBUFFERED": "1"}


def gpu_device_nodes(dev: Path = Path("/dev")) -> list[str]:
    """The GPU device nodes of this host: ``kfd`` (ROCm) and ``nvidia<N>`` (CUDA)."""
    nodes = ["kfd"] if (dev / "kfd").exists() else []
    return nodes + sorted(p.name for p in dev.glob("nvidia[0-9]*"))


def parse_env_assignments(items: list[str], option: str) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings of ``--env``/``--b-env`` as pairs."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(
                f"{option} {item!r}: expected KEY=VALUE, e.g. {option} TORCH_BLAS_PREFER_CUBLASLT=1"
            )
        pairs.append((key, value))
    return tuple(pairs)


def gemm_case(dtype: str, m: int, n: int, k: int, name: str, backend: str = "torch") -> dict:
    """A GEMM case: ``out = a @ w.T`` with a (m, k) and w (n, k), as a linear layer computes it."""
    return {
        "id": f"gemm-{backend}-{dtype}-{m}x{n}x{k}",
        "label": f"{backend} {dtype} {name} {m}x{n}x{k}",
        "kind": "gemm",
        "backend": backend,
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
    }


def plan(
    sections: list[str], *, quick: bool, fp8_dtype: str | None, arch: str
) -> tuple[list[dict], list[dict]]:
    """The cases to time, in order, and what is skipped with the reason."""
    cases: dict[str, dict] = {}
    skipped: list[dict] = []

    def add(case: dict) -> None:
        cases.setdefault(case["id"], case)

    # --quick and the Triton comparison: the square, and one projection at decode and prefill.
    few = [(SQUARE, SQUARE, SQUARE, "square")] + [
        (m, 14336, 4096, f"{phase} 8B gate/up") for m, phase in ((DECODE_M, "decode"), (PREFILL_M, "prefill"))
    ]
    shapes = (
        few
        if quick
        else few[:1]
        + [
            (m, n, k, f"{phase} {name}")
            for n, k, name in PROJECTIONS
            for m, phase in ((DECODE_M, "decode"), (PREFILL_M, "prefill"))
        ]
    )
    if "gemm" in sections:
        dtypes = ["bf16"] if quick else ["bf16", "fp16", "fp8"]
        if "fp8" in dtypes and fp8_dtype is None:
            dtypes.remove("fp8")
            skipped.append({"what": "gemm fp8", "why": f"{arch} has no fp8 matrix instructions"})
        for dtype in dtypes:
            for m, n, k, name in shapes:
                case = gemm_case(dtype, m, n, k, name)
                if dtype == "fp8":
                    case["fp8_dtype"] = fp8_dtype
                add(case)
    if "bandwidth" in sections:  # 1 GiB is far beyond any cache: no flush needed
        add(
            {
                "id": "copy",
                "label": f"copy {COPY_BYTES >> 20} MiB",
                "kind": "copy",
                "bytes": COPY_BYTES,
                "flush": False,
            }
        )
    if "triton" in sections:
        for m, n, k, name in few:
            add(gemm_case("bf16", m, n, k, name))
            add(gemm_case("bf16", m, n, k, name, backend="triton"))
    return list(cases.values()), skipped


class Worker:
    """A ``bench/worker.py serve`` process in one environment; requests and answers are JSON lines."""

    def __init__(self, env: Env, out: Path):
        self.env = env
        self.log_path = out / f"worker-{env.name}.log"
        self.log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        try:
            self.proc = subprocess.Popen(
                [env.python, "-c", BOOT, str(WORKER), MARK, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
                env=env.environ(dict(os.environ)),
                cwd=out,
            )
        except OSError as exc:
            self.log.close()
            raise UserError(
                f"cannot start {env.python} ({exc.strerror}): give --python the path of a Python interpreter"
            ) from exc

    def request(self, **request) -> dict:
        """Send one request, return its answer; other output goes to the worker's log."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the worker died: reported below with its exit code
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
            self.log.write(line)
        self.log.flush()
        raise UserError(
            f"the bench worker in {self.env.label} exited with code {self.proc.wait()} during "
            f"{request['op']}; its log is {self.log_path}"
        )

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def parse_nvidia_smi(text: str) -> list[dict]:
    """``nvidia-smi --query-gpu=NVIDIA_SMI_FIELDS --format=csv,noheader,nounits`` as dicts.

    A line with the wrong number of fields (cut off when a sampling loop is stopped) is dropped.
    """
    gpus = []
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(NVIDIA_SMI_FIELDS):
            gpus.append(
                {field: _number(value) for field, value in zip(NVIDIA_SMI_FIELDS, values, strict=True)}
            )
    return gpus


def _number(value: str):
    try:
        return float(value)
    except ValueError:
        return value


def _nvidia_smi_argv(tool: str) -> list[str]:
    return [tool, "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS), "--format=csv,noheader,nounits"]


class ClockSampler:
    """Clocks, power and temperature sampled by nvidia-smi's own loop while the timed work runs:
    under sustained matrix work a GPU can sit at its power limit with the SM clock well below
    its maximum, and the figures are only comparable with that noted. rocm-smi has no such
    loop; there the snapshots before and after stand alone."""

    def __init__(self, which=shutil.which):
        tool = which("nvidia-smi")
        self.proc = None
        if tool:
            self.proc = subprocess.Popen(
                [*_nvidia_smi_argv(tool), "-lms", str(CLOCK_SAMPLE_MS)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )

    def stop(self) -> dict:
        """The samples taken since the start, with their summary."""
        snapshot: dict = {"when": "during timing"}
        if self.proc is None:
            return {**snapshot, "note": "no nvidia-smi: clocks were not sampled during timing"}
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=CLOCK_QUERY_TIMEOUT_S)
        samples = parse_nvidia_smi(out)
        return {
            **snapshot,
            "tool": "nvidia-smi",
            "interval_ms": CLOCK_SAMPLE_MS,
            "summary": bench_report.clock_summary(samples),
            "gpus": samples,
        }


def query_clocks(when: str, which=shutil.which) -> dict:
    """GPU clocks, power and temperature now, from whichever vendor tool is on PATH."""
    snapshot: dict = {"when": when, "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if tool := which("nvidia-smi"):
        argv = _nvidia_smi_argv(tool)
        parse = parse_nvidia_smi
    elif tool := which("rocm-smi"):
        argv = [tool, "--showclocks", "--showtemp", "--showpower", "--json"]
        parse = json.loads
    else:
        return {**snapshot, "note": "neither nvidia-smi nor rocm-smi is on PATH: clocks not recorded"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CLOCK_QUERY_TIMEOUT_S, check=True)
        return {**snapshot, "tool": Path(tool).name, "gpus": parse(proc.stdout)}
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        return {**snapshot, "tool": Path(tool).name, "note": f"query failed: {exc}"}


def time_cases(workers: list[Worker], cases: list[dict], rounds: int, reps: int, peak) -> list[dict]:
    """Time every case in every environment, alternating which environment goes first per round."""
    results = []
    for i, case in enumerate(cases, 1):
        got: dict[str, dict | str] = {w.env.name: {"rounds": [], "check": {}} for w in workers}
        for r in range(rounds):
            for worker in workers if r % 2 == 0 else workers[::-1]:
                entry = got[worker.env.name]
                if isinstance(entry, str):
                    continue
                answer = worker.request(op="time", case=case, reps=reps)
                if "error" in answer:
                    got[worker.env.name] = answer["error"]
                else:
                    entry["rounds"].append(answer["times_ms"])
                    entry["check"] = answer["check"]
        result = bench_report.case_result(case, got, peak)
        console.print(f"[{i}/{len(cases)}] {_progress_line(result)}")
        results.append(result)
    return results


def _progress_line(result: dict) -> str:
    parts = []
    for label, env in result["envs"].items():
        if "error" in env:
            parts.append(f"{label}: error: {env['error']}")
            continue
        f = env["figures"]
        rate = f"{f['tflops']:.1f} TFLOP/s" if "tflops" in f else f"{f['gbps']:.0f} GB/s"
        parts.append(f"{label} {env['stats']['median_ms']:.4f} ms {rate}")
    if "ab" in result:
        parts.append(f"A/B x{result['ab']['ratio']:.3f}")
    return f"{result['label']}: " + ", ".join(parts)


def run_vllm(envs: list[Env], probes: dict[str, dict], model: Path, rounds: int, out: Path) -> dict:
    """vLLM offline throughput per environment, each round a fresh process, rounds alternating."""
    spec = {**VLLM_SPEC, "model": str(model)}
    runs: dict[str, list[dict] | dict] = {}
    for env in envs:
        if probes[env.name].get("vllm") is None:
            runs[env.name] = {"skipped": f"vllm is not installed in {env.python}"}
        else:
            runs[env.name] = []
    for r in range(rounds):
        for env in envs if r % 2 == 0 else envs[::-1]:
            if isinstance(runs[env.name], dict):
                continue
            log_path = out / f"vllm-{env.name}.log"
            console.print(f"vllm round {r + 1}/{rounds} in {env.name} (log: {log_path})")
            with open(log_path, "a", encoding="utf-8") as log:
                try:
                    proc = subprocess.run(
                        [env.python, "-c", BOOT, str(WORKER), MARK, "vllm", json.dumps(spec)],
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                        env=env.environ(dict(os.environ)),
                        cwd=out,
                        timeout=VLLM_TIMEOUT_S,
                    )
                except subprocess.TimeoutExpired:
                    runs[env.name] = {"error": f"no answer within {VLLM_TIMEOUT_S} s; see {log_path}"}
                    continue
                answers = [
                    json.loads(line[len(MARK) :])
                    for line in proc.stdout.splitlines()
                    if line.startswith(MARK)
                ]
                log.write(proc.stdout)
            if not answers:
                runs[env.name] = {"error": f"the vllm run exited with code {proc.returncode}; see {log_path}"}
            elif "error" in answers[0]:
                runs[env.name] = {"error": f"{answers[0]['error']}; see {log_path}"}
            else:
                runs[env.name].append(answers[0])
    return {"spec": spec, **bench_report.vllm_result(runs)}


def _default_out() -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return ROOT / "logs" / "bench" / stamp


def _envs(args: argparse.Namespace) -> list[Env]:
    envs = [Env("A", args.python, parse_env_assignments(args.env, "--env"))]
    if args.b_python or args.b_env:
        envs.append(Env("B", args.b_python or args.python, parse_env_assignments(args.b_env, "--b-env")))
    return envs


def _sections(text: str) -> list[str]:
    sections = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        raise UserError(f"--only {text!r}: choose from {','.join(SECTIONS)} (comma-separated)")
    return sections


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m rocmforge bench`` (and ``python -m rocmforge.bench``)."""
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter of the environment to measure (A)"
    )
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="variable set for A")
    parser.add_argument("--b-python", help="A/B mode: interpreter of the environment to compare against (B)")
    parser.add_argument(
        "--b-env", action="append", default=[], metavar="KEY=VALUE", help="A/B mode: variable set for B"
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"sections to run (default {','.join(SECTIONS)})"
    )
    parser.add_argument("--quick", action="store_true", help="bf16 only, three shapes, fewer calls")
    parser.add_argument(
        "--rounds", type=int, help="rounds per case (default 5, quick 3); A/B rounds alternate"
    )
    parser.add_argument("--reps", type=int, help="timed calls per round (default 20, quick 10)")
    parser.add_argument(
        "--model", type=Path, default=TINY_MODEL, help="model folder for vLLM (dummy weights)"
    )
    parser.add_argument(
        "--out", type=Path, help="folder for bench.json, bench.png and logs (default logs/bench/TIME)"
    )


def main(args: argparse.Namespace) -> int:
    """Run the bench; see the module docstring for the exit codes."""
    if not gpu_device_nodes():
        raise UserError(NO_GPU_NODE, exit_code=NO_GPU)
    sections = _sections(args.only)
    envs = _envs(args)
    rounds = args.rounds or (3 if args.quick else 5)
    reps = args.reps or (10 if args.quick else 20)
    if rounds < 1 or reps < 1:
        raise UserError("--rounds and --reps must be at least 1")
    out = (args.out or _default_out()).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workers: list[Worker] = []
    try:
        for env in envs:
            workers.append(Worker(env, out))
        probes = {w.env.name: w.request(op="probe") for w in workers}
        for env in envs:
            _require_gpu(env, probes[env.name])
        gpu = probes["A"]["gpu"]
        peak = lookup(gpu["name"])
        if peak is None:
            console.print(f"no peak figures for {gpu['name']!r}: add a row to rocmforge/bench/peaks.py")
        report: dict = {
            "schema": 1,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "settings": {"sections": sections, "quick": args.quick, "rounds": rounds, "reps": reps},
            "envs": {
                e.name: {"label": e.label, "overrides": dict(e.overrides), **probes[e.name]} for e in envs
            },
            "gpu": gpu,
            "peak": peak.to_json() if peak else None,
            "clocks": [query_clocks("start")],
        }
        cases, report["skipped"] = plan(
            sections, quick=args.quick, fp8_dtype=probes["A"]["fp8_dtype"], arch=gpu["arch"]
        )
        sampler = ClockSampler()
        try:
            report["results"] = time_cases(workers, cases, rounds, reps, peak)
        finally:
            report["clocks"].append(sampler.stop())
        report["triton_vs_torch"] = bench_report.triton_vs_torch(report["results"])
        square = gemm_case("bf16", SQUARE, SQUARE, SQUARE, "square")
        if "gemm" in sections:
            ours = next(r for r in report["results"] if r["id"] == square["id"])["envs"]["A"]
            if "stats" in ours:
                independent = workers[0].request(op="crosscheck", case=square)
                report["crosscheck"] = {
                    "case": square["id"],
                    **bench_report.crosscheck(ours["stats"]["median_ms"], independent),
                }
    finally:
        for worker in workers:
            worker.close()
    if "vllm" in sections:
        report["vllm"] = run_vllm(envs, probes, args.model.resolve(), 2 if len(envs) == 2 else 1, out)
    report["clocks"].append(query_clocks("end"))
    return _finish(report, out)


def _require_gpu(env: Env, probe: dict) -> None:
    if probe.get("torch") is None:
        raise UserError(
            f"{env.python} cannot import torch ({probe.get('error')}): give --python the interpreter "
            "of the environment that holds the wheels to measure"
        )
    if probe.get("gpu") is None:
        raise UserError(
            f"no GPU: torch {probe['torch']} (hip {probe['hip']}, cuda {probe['cuda']}) in {env.python} "
            "sees no device",
            exit_code=NO_GPU,
        )


def _finish(report: dict, out: Path) -> int:
    """Write bench.json, print the summary, draw bench.png, and say whether everything passed."""
    json_path = atomic_write(out / "bench.json", json.dumps(report, indent=1) + "\n")
    bench_report.print_summary(report, console)
    try:
        png_path = atomic_write(out / "bench.png", bench_report.plot(report))
    except ImportError:
        png_path = None
        console.print("bench.png not written: matplotlib is not installed here (pip install matplotlib)")
    console.print(f"results: {json_path}" + (f" and {png_path}" if png_path else ""))
    failures = bench_report.failures(report)
    for failure in failures:
        console.print(f"[red]FAILED[/red] {failure}")
    return CASE_FAILED if failures else 0


def nox_session(session, cfg) -> None:
    """``nox -s bench``: install the wheelhouse and matplotlib into the session and bench them.

    Arguments after ``--`` go to the bench (e.g. ``-- --quick`` or ``-- --b-python PATH``).
    """
    if not gpu_device_nodes():
        print(f"rocmforge bench: {NO_GPU_NODE}", file=sys.stderr)  # before any install
        raise SystemExit(NO_GPU)
    wheelhouse = cfg.build.wheelhouse
    names = sorted({whl.name.split("-")[0] for whl in wheelhouse.glob("*.whl")})
    if not names:
        session.error(
            f"no wheels in {wheelhouse}: build them first (nox -s pytorch triton vllm), or measure any "
            "environment with: python -m rocmforge.bench --python PATH"
        )
    constraints = wheelhouse / "constraints.txt"
    pins = ["-c", str(constraints)] if constraints.is_file() else []
    session.install("--find-links", str(wheelhouse), *pins, *names)
    session.install("-e", str(ROOT), "matplotlib")
    session.run("python", "-m", "rocmforge.bench", *session.posargs)
