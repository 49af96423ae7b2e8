"""PyTorch: hipify for ROCm, its requirements files, versioned with a local label.

Options (``[packages.pytorch.options]``):
- ``build_number`` (int, default 1): ``PYTORCH_BUILD_NUMBER``; above 1 PyTorch appends ``.postN``.
- ``flash_attention`` (bool): force flash/mem-efficient attention on or off instead of
  deciding from the arch list.
- ``rocm_libraries`` (bool, default true): false for a torch-like tree that links only the HIP
  runtime (the stack rehearsal's minitorch); the doctor then stops requiring rocBLAS, MIOpen, RCCL.
- ``build_test``, ``use_mpi``, ``use_numa`` (bool, default false): ``BUILD_TEST``, ``USE_MPI``,
  ``USE_NUMA``. PyTorch builds its C++ tests and links MPI and libnuma whenever the build host
  happens to have them; a wheel for other machines wants none of that unless asked for.
- ``aotriton_prefix`` (path): ``AOTRITON_INSTALLED_PREFIX``, an AOTriton install to use instead of
  the one PyTorch's CMake downloads from GitHub (needed offline; docs/sources.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rocmforge.build.recipes import Context, read_requirements
from rocmforge.build.recipes.generic import Generic

# GPU targets AOTriton (the kernels behind flash and memory-efficient attention on ROCm) ships
# images for. One arch outside the set and the AOTriton step of the build fails, so both
# attentions stay off unless every configured arch is in it.
AOTRITON_ARCHS = frozenset({"gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201"})

# The Triton distributions torch's wheel may depend on; with our own Triton built they must go,
# or installing torch drags a second Triton in from PyPI.
TRITON_PROJECTS = {"triton", "pytorch-triton-rocm", "pytorch-triton"}

# option -> PyTorch's variable; all off unless the config turns them on (see the module doc).
OFF_BY_DEFAULT = {"build_test": "BUILD_TEST", "use_mpi": "USE_MPI", "use_numa": "USE_NUMA"}


class PyTorch(Generic):
    name = "pytorch"
    location_variables = ("AOTRITON_INSTALLED_PREFIX",)

    def build_requirements(self, ctx: Context) -> list[str]:
        root = self.project_dir(ctx.checkout)
        # requirements-build.txt is the build-only subset in newer trees; requirements.txt
        # (which includes it) in older ones.
        for name in ("requirements-build.txt", "requirements.txt"):
            if (root / name).is_file():
                return ["build", "wheel", *read_requirements(root / name)]
        return super().build_requirements(ctx)

    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        backend = ctx.cfg.build.backend
        out = {
            "USE_ROCM": "1" if backend == "rocm" else "0",
            "USE_CUDA": "1" if backend == "cuda" else "0",
            "PYTORCH_BUILD_NUMBER": str(ctx.option("build_number", 1)),
            **{var: "1" if ctx.option(option, False) else "0" for option, var in OFF_BY_DEFAULT.items()},
        }
        if ctx.option("aotriton_prefix"):
            out["AOTRITON_INSTALLED_PREFIX"] = str(ctx.option("aotriton_prefix"))
        # The build Python's prefix, as vLLM's Dockerfile (CMAKE_PREFIX_PATH=sys.prefix) and
        # PyTorch's README set it, so CMake finds what the build venv installed (pybind11, ...);
        # after the ROCm root, which find_package(hip) needs first.
        prefix = str(ctx.python.parent.parent)
        out["CMAKE_PREFIX_PATH"] = os.pathsep.join(
            dict.fromkeys([*filter(None, env.get("CMAKE_PREFIX_PATH", "").split(os.pathsep)), prefix])
        )
        if ctx.pins:
            # PyTorch's own switch for extra Requires-Dist lines ("|"-separated), as its release
            # builds use it for pytorch-triton-rocm: torch names our Triton at exactly its version.
            out["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"] = "|".join(f"{p}=={v}" for p, v in ctx.pins.items())
        version = ctx.version
        if version:
            label = ctx.package.local_version
            out["PYTORCH_BUILD_VERSION"] = f"{version}+{label}" if label else version
        if backend == "rocm":
            wanted = ctx.option("flash_attention", None)
            if wanted is None:
                wanted = all(a.split(":")[0] in AOTRITON_ARCHS for a in ctx.cfg.build.arch)
            flag = "1" if wanted else "0"
            out["USE_FLASH_ATTENTION"] = out["USE_MEM_EFF_ATTENTION"] = flag
        return out

    def prepare_commands(self, ctx: Context) -> list[list[str]]:
        if ctx.cfg.build.backend != "rocm":
            return []
        # HIPIFY rewrites the CUDA sources into HIP in place; it is idempotent, so a rebuild
        # of an already-hipified tree is fine.
        return [[str(ctx.python), "tools/amd_build/build_amd.py"]]

    def build_command(self, ctx: Context) -> list[str]:
        root = self.project_dir(ctx.checkout)
        if _has_build_backend(root):
            return super().build_command(ctx)
        # Older pins have no PEP 517 backend declared: setup.py is the build.
        return [str(ctx.python), "setup.py", "bdist_wheel", "--dist-dir", str(ctx.dist_dir)]

    def dropped_requirements(self, ctx: Context) -> set[str]:
        return set(TRITON_PROJECTS) if ctx.builds_own("triton") else set()

    def native_local_version(self, ctx: Context) -> bool:
        # PYTORCH_BUILD_VERSION carries it, when the version is known; else torch names itself
        # (version.txt + git sha) and the wheel is relabelled.
        return "PYTORCH_BUILD_VERSION" in self.environment(ctx, {})


def _has_build_backend(root: Path) -> bool:
    from rocmforge.build.recipes import tomllib

    path = root / "pyproject.toml"
    return path.is_file() and "build-backend" in tomllib.loads(path.read_text()).get("build-system", {})


RECIPE = PyTorch()
