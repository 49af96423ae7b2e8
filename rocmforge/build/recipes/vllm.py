"""vLLM: built without build isolation against the wheelhouse's torch (and Triton).

With build isolation pip would fetch PyPI's CUDA torch into a throwaway environment and the
ROCm build dies with ``CUDA_HOME is not set``; so the build requirements come from vLLM's
``requirements/build/<device>.txt`` minus torch and Triton, which come from our wheelhouse.

Options (``[packages.vllm.options]``):
- ``target_device``: ``VLLM_TARGET_DEVICE`` (``rocm``, ``cuda``, ``cpu``, ``empty``); default from
  ``build.backend``. ``empty`` builds the pure-Python package without kernels.
- ``rust_frontend``: ``true`` makes the Rust frontend (``vllm-rs``) required, so a missing Rust
  toolchain fails the build. By default vLLM treats it as optional: built when the toolchain
  named in its ``rust-toolchain.toml`` is installed (and crates.io is reachable), skipped with a
  warning otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rocmforge.build.recipes import Context, pyproject_build_requires, read_requirements
from rocmforge.build.recipes.generic import Generic
from rocmforge.errors import UserError

TARGET_DEVICES = ("rocm", "cuda", "cpu", "empty")
# Provided by our wheelhouse, never by vLLM's pins.
_FROM_WHEELHOUSE = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"}


class VLLM(Generic):
    name = "vllm"
    location_variables = ("TRITON_KERNELS_SRC_DIR",)

    def target_device(self, ctx: Context) -> str:
        device = ctx.option("target_device", ctx.cfg.build.backend)
        if device not in TARGET_DEVICES:
            raise UserError(
                f"packages.{ctx.package.name}.options.target_device: {device!r} is not one of "
                f"{', '.join(TARGET_DEVICES)}"
            )
        return device

    def build_requirements(self, ctx: Context) -> list[str]:
        root = self.project_dir(ctx.checkout)
        pinned = root / "requirements" / "build" / f"{self.target_device(ctx)}.txt"
        reqs = read_requirements(pinned) if pinned.is_file() else pyproject_build_requires(root) or []
        if not any(_provides_torch(path) for path in ctx.dependencies.values()):
            raise UserError(
                f"packages.{ctx.package.name}: vLLM builds against torch from the wheelhouse; add the "
                "torch package (built or [prebuilt]) to its depends"
            )
        return ["build", *(r for r in reqs if canonicalize_name(Requirement(r).name) not in _FROM_WHEELHOUSE)]

    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        out = {"VLLM_TARGET_DEVICE": self.target_device(ctx)}
        version = ctx.version
        if version:
            # A patched git checkout would otherwise version itself "...dirty" via setuptools-scm.
            out["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
        kernels = _triton_kernels_dir(ctx)
        if kernels:
            out["TRITON_KERNELS_SRC_DIR"] = str(kernels)
        if ctx.option("rust_frontend", False):
            out["VLLM_REQUIRE_RUST_FRONTEND"] = "1"
        return out


def _provides_torch(wheel: Path) -> bool:
    return wheel.name.split("-", 1)[0].lower() == "torch"


def _triton_kernels_dir(ctx: Context) -> Path | None:
    """The ``triton_kernels`` package inside our Triton checkout, for vLLM's CMake to use.

    The checkout already made (Triton is built before vLLM); asking for the environment fetches
    nothing."""
    from rocmforge.sources import checkout as sources

    depends = list(ctx.package.depends)
    for dep in ctx.cfg.build_order(depends) if depends else []:
        pkg = ctx.cfg.package(dep)
        if pkg.recipe == "triton" and pkg.source is not None:
            checkout = sources.existing(ctx.cfg, dep)
            if checkout is None:
                return None
            path = Path(checkout.path) / "python" / "triton_kernels" / "triton_kernels"
            return path if path.is_dir() else None
    return None


RECIPE = VLLM()
