"""torchvision (pytorch/vision), built against our torch: versioned and pinned the way its
release builds do it.

- ``BUILD_VERSION``: the wheel's version (``packages.NAME.version`` + ``local_version``);
  without it setup.py appends the git sha (``0.28.0a0+abc1234``);
- ``PYTORCH_VERSION``: setup.py then requires ``torch==<that version>``, our torch exactly;
- ``FORCE_CUDA=1`` for a GPU backend: setup.py compiles its GPU operators (nms, roi_align, ...)
  only when ``torch.cuda.is_available()``, i.e. only on a build host with a GPU; forced, the
  wheel is the same on a GPU-less build box (the vLLM Dockerfile's ``docker build`` has none).

Options (``[packages.torchvision.options]``): ``force_cuda`` (bool, default true for rocm/cuda).
"""

from __future__ import annotations

from collections.abc import Mapping

from rocmforge.build.recipes import Context
from rocmforge.build.recipes.generic import Generic

# The torch projects a domain library is built against; its PYTORCH_VERSION names one of them.
TORCH_PROJECTS = ("torch",)


class TorchDomainLibrary(Generic):
    """torchvision's and torchaudio's shared build switches (their setup.py read the same ones)."""

    name = "torchvision"

    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        version = ctx.version
        if version:
            label = ctx.package.local_version
            out["BUILD_VERSION"] = f"{version}+{label}" if label else version
        torch = next((v for p, v in ctx.pins.items() if p in TORCH_PROJECTS), None)
        if torch:
            out["PYTORCH_VERSION"] = torch
        return out

    def native_local_version(self, ctx: Context) -> bool:
        return "BUILD_VERSION" in self.environment(ctx, {})


class TorchVision(TorchDomainLibrary):
    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        out = super().environment(ctx, env)
        if ctx.option("force_cuda", ctx.cfg.build.backend in ("rocm", "cuda")):
            out["FORCE_CUDA"] = "1"
        return out


RECIPE = TorchVision()
