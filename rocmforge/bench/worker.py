"""The half of ``bench`` that runs inside the environment being measured.

It is started by path with that environment's interpreter (``bench.Worker``), so it imports
nothing from rocmforge: only the standard library, torch, triton and vllm of that environment.
Two modes:

- ``MARK serve``: answers JSON requests, one per stdin line (``probe``, ``time``, ``crosscheck``);
  inputs of the last case stay on the GPU so interleaved rounds do not rebuild them;
- ``MARK vllm SPEC``: one offline-throughput run in a fresh process (vLLM wants a clean CUDA state).

Answers are single stdout lines starting with the mark given as the first argument (the
orchestrator owns it); anything else a library prints is passed to the log. Every timing is a
pair of device events around one call, with a cache flush (a write larger than the last-level
cache) before each call so every call reads its operands from device memory, as a weight
matrix in inference does.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import time
import traceback

MARK = ""  # set from argv by main()
FLUSH_MIN_BYTES = 512 * 2**20  # above MI300's 256 MB Infinity Cache, many times a Hopper L2
FIRST_WARMUP_MS = 200.0  # first use of a case: library heuristics, Triton autotuning, clocks up
ROUND_WARMUP_CALLS = 3


def _answer(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def fp8_dtype_name(arch: str) -> str | None:
    """The e4m3 fp8 dtype the device's matrix units take, or None where they have none.

    gfx942 (MI300X/MI325X) implements the FNUZ variant, gfx950 and gfx12 the OCP one that
    NVIDIA uses from sm_89 on.
    """
    if arch.startswith("sm_"):
        return "float8_e4m3fn" if int(arch[3:]) >= 89 else None
    base = arch.split(":")[0]
    if base == "gfx942":
        return "float8_e4m3fnuz"
    if base == "gfx950" or base.startswith("gfx12"):
        return "float8_e4m3fn"
    return None


def probe() -> dict:
    """What this environment is: interpreter, torch build, GPU, BLAS preference, fp8, versions."""
    info: dict = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "triton": _dist_version("triton") or _dist_version("pytorch-triton-rocm"),
        "vllm": _dist_version("vllm"),
    }
    try:
        import torch
    except Exception as exc:  # a broken torch is a finding to report, not a crash
        info.update(torch=None, error=f"cannot import torch: {exc}")
        return info
    info.update(torch=torch.__version__, hip=torch.version.hip, cuda=torch.version.cuda, gpu=None)
    if not torch.cuda.is_available():
        return info
    props = torch.cuda.get_device_properties(0)
    arch = getattr(props, "gcnArchName", "") if torch.version.hip else f"sm_{props.major}{props.minor}"
    info["gpu"] = {
        "name": props.name,
        "arch": arch,
        "multiprocessors": props.multi_processor_count,
        "mem_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", 0),
        "count": torch.cuda.device_count(),
    }
    info["blas"] = str(torch.backends.cuda.preferred_blas_library())
    info["fp8_dtype"] = fp8_dtype_name(arch)
    return info


class Server:
    """Answers ``time`` and ``crosscheck`` requests, keeping the inputs of the last case."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(0)
        props = torch.cuda.get_device_properties(0)
        flush_bytes = max(FLUSH_MIN_BYTES, 4 * getattr(props, "L2_cache_size", 0))
        self.flush_buf = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
        self.case_id: str | None = None
        self.fn = None
        self.check: dict = {}

    def _prepare(self, case: dict) -> None:
        if case["id"] == self.case_id:
            return
        self.case_id, self.fn, self.check = None, None, {}
        self.torch.cuda.empty_cache()
        if case["kind"] == "gemm":
            self.fn, self.check = self._gemm(case)
        elif case["kind"] == "copy":
            self.fn, self.check = self._copy(case)
        else:
            raise ValueError(f"unknown case kind {case['kind']!r}")
        self._call_for(FIRST_WARMUP_MS)
        self.case_id = case["id"]

    def _call_for(self, ms: float) -> None:
        torch = self.torch
        start = time.perf_counter()
        calls = 0
        while calls < 5 or (time.perf_counter() - start) * 1e3 < ms:
            self.fn()
            torch.cuda.synchronize()
            calls += 1

    def _gemm(self, case: dict):
        """``out = a @ w.T`` as a linear layer computes it: a (M, K) activations, w (N, K) weights."""
        torch = self.torch
        m, n, k = case["m"], case["n"], case["k"]
        a = torch.randn(m, k, device="cuda", dtype=torch.float32)
        w = torch.randn(n, k, device="cuda", dtype=torch.float32)
        if case["dtype"] == "fp8":
            fp8 = getattr(torch, case["fp8_dtype"])
            a, w = a.to(fp8), w.to(fp8)
            one = torch.ones((), device="cuda", dtype=torch.float32)

            def fn():
                return torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        else:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case["dtype"]]
            a, w = a.to(dtype), w.to(dtype)
            if case["backend"] == "triton":

                def fn():
                    return matmul_tn(a, w)

            else:

                def fn():
                    return torch.mm(a, w.t())

        # Correctness against float32 arithmetic on the same (rounded) operands, on a row slice
        # so the reference stays cheap; bf16/fp16/fp8 results land near 1e-3, wrong code near 1.
        rows = min(m, 256)
        ref = a[:rows].float() @ w.float().t()
        out = fn()[:rows].float()
        rel_err = (torch.linalg.norm(out - ref) / torch.linalg.norm(ref)).item()
        return fn, {"rel_err": rel_err}

    def _copy(self, case: dict):
        torch = self.torch
        src = torch.randn(case["bytes"] // 4, device="cuda", dtype=torch.float32)
        dst = torch.empty_like(src)

        def fn():
            return dst.copy_(src)

        fn()
        return fn, {"equal": bool(torch.equal(dst, src))}

    def time(self, case: dict, reps: int) -> dict:
        """Per-call device times in ms of ``reps`` calls, each after a cache flush."""
        torch = self.torch
        self._prepare(case)
        for _ in range(ROUND_WARMUP_CALLS):
            self.fn()
        flush = case.get("flush", True)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends, strict=True):
            if flush:
                self.flush_buf.zero_()
            start.record()
            self.fn()
            end.record()
        torch.cuda.synchronize()
        return {
            "times_ms": [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)],
            "check": self.check,
        }

    def crosscheck(self, case: dict) -> dict:
        """Median ms of the same call timed by two independent timers of the environment."""
        self._prepare(case)
        out: dict = {}
        if triton is None:
            out["triton.testing.do_bench"] = f"skipped: triton is not importable here ({NO_TRITON})"
        else:
            out["triton.testing.do_bench"] = triton.testing.do_bench(
                self.fn, warmup=100, rep=500, return_mode="median"
            )
        from torch.utils import benchmark

        timer = benchmark.Timer(stmt="fn()", globals={"fn": self.fn})
        out["torch.utils.benchmark"] = timer.blocked_autorange(min_run_time=1.0).median * 1e3
        return out


try:  # the kernel exists only in environments with Triton; its cases fail clearly elsewhere
    import triton
    import triton.language as tl
    import triton.testing
except Exception as exc:  # missing, or broken against this torch: a finding to report
    triton = None
    NO_TRITON = str(exc)
else:
    NO_TRITON = ""
    _CONFIGS = [
        triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in (
            (128, 256, 64, 8, 3),
            (256, 128, 64, 8, 3),
            (128, 128, 64, 4, 4),
            (128, 128, 64, 8, 2),
            (64, 64, 128, 4, 3),
        )
    ]

    @triton.autotune(configs=_CONFIGS, key=["M", "N", "K"])
    @triton.jit
    def _matmul_tn_kernel(
        a_ptr, w_ptr, c_ptr, M, N, K, sam, sak, swn, swk, scm, scn,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
    ):  # fmt: skip
        # Grouped launch order: GROUP row-blocks reuse each column-block of w while it is in L2.
        pid = tl.program_id(0)
        n_m = tl.cdiv(M, BM)
        n_n = tl.cdiv(N, BN)
        first_m = (pid // (GROUP * n_n)) * GROUP
        rows_in_group = tl.minimum(n_m - first_m, GROUP)
        pid_m = first_m + (pid % (GROUP * n_n)) % rows_in_group
        pid_n = (pid % (GROUP * n_n)) // rows_in_group
        offs_m = (pid_m * BM + tl.arange(0, BM)) % M  # wrapped rows: loads stay in bounds
        offs_n = (pid_n * BN + tl.arange(0, BN)) % N
        offs_k = tl.arange(0, BK)
        a_tile = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
        w_tile = w_ptr + offs_k[:, None] * swk + offs_n[None, :] * swn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BK)):
            k_left = K - kb * BK
            a = tl.load(a_tile, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_tile, mask=offs_k[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc)
            a_tile += BK * sak
            w_tile += BK * swk
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        c = c_ptr + rm[:, None] * scm + rn[None, :] * scn
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_tn(a, w):
    """``a @ w.T`` with the Triton kernel above (a: M x K, w: N x K, same dtype)."""
    import torch

    if triton is None:
        raise RuntimeError(f"triton is not importable here ({NO_TRITON})")
    m, k = a.shape
    n = w.shape[0]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)

    def grid(meta):
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

    _matmul_tn_kernel[grid](
        a, w, c, m, n, k, a.stride(0), a.stride(1), w.stride(0), w.stride(1), c.stride(0), c.stride(1)
    )
    return c


def serve() -> int:
    """Answer requests until stdin closes; a failing request answers with its error."""
    server = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            op = request["op"]
            if op == "probe":
                _answer(probe())
                continue
            if server is None:
                server = Server()
            if op == "time":
                _answer(server.time(request["case"], request["reps"]))
            elif op == "crosscheck":
                _answer(server.crosscheck(request["case"]))
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:
            traceback.print_exc()
            if server is not None:
                server.case_id = None  # the case may be half-built: rebuild it on next use
            _answer({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    return 0


def run_vllm(spec: dict) -> dict:
    """Offline throughput of ``spec['model']`` with dummy weights: rounds of one ``generate``."""
    import random

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec["model"],
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=spec["input_len"] + spec["output_len"],
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        enforce_eager=spec["enforce_eager"],
        seed=0,
    )
    rng = random.Random(0)
    # Byte tokens only (ids below 256 in the shipped tokenizer): no special token mid-prompt.
    prompts = [
        {"prompt_token_ids": [rng.randrange(256) for _ in range(spec["input_len"])]}
        for _ in range(spec["num_prompts"])
    ]
    params = SamplingParams(temperature=1.0, max_tokens=spec["output_len"], ignore_eos=True)
    llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up: graphs, allocator, sampler
    seconds, generated = [], 0
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "seconds": seconds,
        "prompt_tokens": spec["num_prompts"] * spec["input_len"],
        "generated_tokens": generated,
    }


def main(argv: list[str]) -> int:
    """``MARK serve`` or ``MARK vllm SPEC-JSON``."""
    global MARK
    if len(argv) < 2:
        print("usage: bench/worker.py MARK serve | MARK vllm SPEC-JSON", file=sys.stderr)
        return 2
    MARK, mode = argv[0], argv[1]
    if mode == "serve":
        return serve()
    try:
        _answer(run_vllm(json.loads(argv[2])))
    except Exception as exc:
        traceback.print_exc()
        _answer({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
