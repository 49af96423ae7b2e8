"""The half of ``verify`` that runs inside the environment being verified.

It is started by path with that environment's interpreter, so it imports nothing from
rocmforge: only the standard library and the torch, triton and vllm being checked. Modes:

- ``dists``: the installed distributions (name, version, requirements, provenance, shared
  objects) and the site directories, as JSON on stdout;
- ``import MODULE``: import one module and nothing else (the parent watches for signals);
- ``gpu --arch A [--arch B] [--model DIR]``: the GPU checks, one JSON object per line:
  device visible, its arch in the built list, matmul against the CPU, a Triton kernel, a
  few vLLM tokens from a dummy-weight model. What cannot run is reported as skipped, with why.
"""

from __future__ import annotations

import os
import sys

# Started by path, so sys.path[0] is rocmforge/verify/, whose inspect.py would shadow the standard
# library's inspect (imported by importlib.metadata on Python 3.12, and by torch): drop it.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import site
import sysconfig
import traceback

PROVENANCE = "rocmforge.json"


def dists() -> dict:
    """Every installed distribution with what verify's static checks need."""
    out = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        files = [str(dist.locate_file(f)) for f in dist.files or () if ".so" in f.name]
        provenance = dist.read_text(PROVENANCE)
        direct_url = dist.read_text("direct_url.json")
        out.append(
            {
                "name": name,
                "version": dist.version,
                "requires": dist.requires or [],
                "provenance": json.loads(provenance) if provenance else None,
                "shared_objects": files,
                # Where it came from, as far as the installer recorded it (PEP 610, PEP 376).
                "installer": (dist.read_text("INSTALLER") or "").strip() or None,
                "direct_url": json.loads(direct_url) if direct_url else None,
                "modules": _top_level_modules(dist),
            }
        )
    return {
        "python": sys.executable,
        "site": sorted(
            {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
        ),
        "dists": out,
    }


def _top_level_modules(dist) -> list[str]:
    """The importable top-level names a distribution installs (packages, modules, extensions)."""
    names = set()
    for f in dist.files or ():
        top = f.parts[0]
        if top.endswith((".dist-info", ".data")) or top in ("..", "__pycache__"):
            continue
        if len(f.parts) > 1 and f.name.endswith(".py"):
            names.add(top)  # a package, regular or namespace
        elif len(f.parts) == 1 and f.name.endswith((".py", ".so")):
            names.add(f.name.split(".")[0])  # a module or an extension module
    return sorted(n for n in names if n.isidentifier())


def _emit(name: str, status: str, detail: str) -> None:
    print(json.dumps({"name": name, "status": status, "detail": detail}), flush=True)


def _device_arch(torch) -> str:
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        return getattr(props, "gcnArchName", "")
    return f"sm_{props.major}{props.minor}"


def _arch_matches(device: str, built: str) -> bool:
    """Whether code built for ``built`` runs on ``device`` (features left open match any)."""
    dev_proc, *dev_feats = device.split(":")
    proc, *feats = built.split(":")
    if proc != dev_proc:
        return False
    return all(f in dev_feats for f in feats)


def _triton_add(torch) -> str:
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask
        )

    n = 10_000
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    if not torch.equal(out, x + y):
        raise AssertionError("Triton's x + y differs from torch's")
    return f"triton {triton.__version__}: vector add of {n} elements matches torch"


def _vllm_generate(model: str) -> str:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=256,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(range(65, 97))}], params, use_tqdm=False)
    tokens = len(out[0].outputs[0].token_ids)
    if tokens != 8:
        raise AssertionError(f"generated {tokens} tokens, expected 8")
    import vllm

    return f"vllm {vllm.__version__}: generated 8 tokens from {model} (dummy weights)"


def gpu(archs: list[str], model: str | None) -> int:
    """Run the GPU checks in order; later ones are skipped once the device is unusable."""
    if importlib.util.find_spec("torch") is None:
        _emit("gpu: device visible", "skip", "torch is not installed in this environment")
        return 0
    try:
        import torch
    except Exception as exc:
        _emit("gpu: device visible", "fail", f"cannot import torch: {exc}")
        return 1
    if not torch.cuda.is_available():
        _emit(
            "gpu: device visible", "skip", "torch sees no GPU (no /dev/kfd or /dev/nvidia*, or a CPU build)"
        )
        return 0
    backend = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    device = _device_arch(torch)
    name = torch.cuda.get_device_name(0)
    _emit(
        "gpu: device visible",
        "ok",
        f"{torch.cuda.device_count()} x {name} ({device}), torch {torch.__version__} {backend}",
    )

    compiled = list(torch.cuda.get_arch_list())
    in_torch = any(_arch_matches(device, a) for a in compiled)
    wanted = [a for a in archs if _arch_matches(device, a)]
    if not in_torch:
        _emit("gpu: arch in built list", "fail", f"{device} is not among torch's compiled archs {compiled}")
    elif archs and not wanted:
        _emit("gpu: arch in built list", "fail", f"{device} is not in the configured archs {archs}")
    else:
        _emit("gpu: arch in built list", "ok", f"{device} in torch's {compiled}")

    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(512, 512, generator=gen)
        b = torch.randn(512, 512, generator=gen)
        gpu_result = (a.cuda() @ b.cuda()).cpu()
        err = (gpu_result - a @ b).abs().max().item()
        status = "ok" if err < 1e-2 else "fail"
        _emit("gpu: matmul vs CPU", status, f"512x512 fp32, max abs difference {err:.2e}")
    except Exception as exc:
        _emit("gpu: matmul vs CPU", "fail", f"{type(exc).__name__}: {exc}")

    try:
        importlib.import_module("triton")
    except ImportError as exc:
        _emit("gpu: Triton kernel", "skip", f"triton not importable: {exc}")
    else:
        try:
            _emit("gpu: Triton kernel", "ok", _triton_add(torch))
        except Exception as exc:
            _emit("gpu: Triton kernel", "fail", _last_lines(exc))

    if importlib.util.find_spec("vllm") is None:
        _emit("gpu: vLLM generates", "skip", "vllm is not installed in this environment")
    elif model is None:
        _emit("gpu: vLLM generates", "skip", "no model config given (--model DIR)")
    else:
        try:
            _emit("gpu: vLLM generates", "ok", _vllm_generate(model))
        except Exception as exc:
            _emit("gpu: vLLM generates", "fail", _last_lines(exc))
    return 0


def _last_lines(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[-600:]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verify_probe")
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("dists")
    imp = sub.add_parser("import")
    imp.add_argument("module")
    g = sub.add_parser("gpu")
    g.add_argument("--arch", action="append", default=[])
    g.add_argument("--model")
    args = parser.parse_args(argv)
    if args.mode == "dists":
        json.dump(dists(), sys.stdout)
        return 0
    if args.mode == "import":
        importlib.import_module(args.module)
        return 0
    return gpu(args.arch, args.model)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
