"""Triton (ROCm/triton for ROCm): ``python/`` or root ``setup.py`` depending on the version.

Options (``[packages.triton.options]``):
- ``llvm_syspath``, ``json_syspath``: local LLVM build and nlohmann-json headers; with both set
  the build is offline (``TRITON_OFFLINE_BUILD=1``) and downloads nothing.

Triton downloads LLVM and other tools into ``TRITON_HOME`` (``<cache_dir>/triton``), shared by
every build of this user.

ROCm stays off CMake's search path: with the ROCm root in ``CMAKE_PREFIX_PATH`` (or found through
``<rocm>/bin`` on ``PATH``) MLIR's ``find_package(LLVM)`` can pick ROCm's own LLVM instead of the
one Triton pins, and the build fails late or links the wrong LLVM (TheRock hit this). Triton
compiles no HIP code, so it loses nothing.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from rocmforge.build.environment import SYSTEM_DIRS
from rocmforge.build.recipes import Context, read_requirements
from rocmforge.build.recipes.generic import Generic
from rocmforge.errors import UserError


class Triton(Generic):
    name = "triton"
    location_variables = ("TRITON_HOME", "LLVM_SYSPATH", "JSON_SYSPATH")

    def project_dir(self, checkout) -> Path:
        # Triton 3.4+ builds from the repository root; older trees keep setup.py in python/.
        root = Path(checkout.project_dir)
        return root / "python" if (root / "python" / "setup.py").is_file() else root

    def build_requirements(self, ctx: Context) -> list[str]:
        root = self.project_dir(ctx.checkout)
        for path in (root / "requirements.txt", root / "python" / "requirements.txt"):
            if path.is_file():
                return ["build", "wheel", *read_requirements(path)]
        return super().build_requirements(ctx)

    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        out = {
            "TRITON_HOME": str(ctx.cfg.build.cache_dir / "triton"),
            # Triton's own ccache launcher (on by default when ccache is installed) would go in
            # front of rocmforge's CC/CXX wrappers, which already cache: every object twice.
            "TRITON_BUILD_WITH_CCACHE": "false",
        }
        llvm, json_dir = ctx.option("llvm_syspath"), ctx.option("json_syspath")
        if bool(llvm) != bool(json_dir):
            raise UserError(
                f"packages.{ctx.package.name}.options: set both llvm_syspath and json_syspath for an "
                "offline Triton build, or neither"
            )
        if llvm:
            # Offline: Triton's setup.py takes LLVM and the json headers from these paths
            # instead of downloading them.
            out.update(TRITON_OFFLINE_BUILD="1", LLVM_SYSPATH=str(llvm), JSON_SYSPATH=str(json_dir))
        rocm = env.get("ROCM_PATH")
        # A distro ROCm in /usr cannot be hidden without hiding the whole system from CMake.
        if rocm and not SYSTEM_DIRS.fullmatch(rocm.rstrip("/")):
            out.update(_without_rocm(env, rocm))
        return out


def _without_rocm(env: Mapping[str, str], rocm: str) -> dict[str, str]:
    """``CMAKE_PREFIX_PATH`` without the ROCm root, and CMake told to ignore that prefix.

    Set even when empty, since the build starts from the caller's environment. PATH keeps
    ``<rocm>/bin`` (CMake would derive the prefix from it), hence ``CMAKE_IGNORE_PREFIX_PATH``
    (CMake >= 3.23; older ones warn that it is unused), passed through Triton's setup.py.
    """
    root = os.path.normpath(rocm)
    kept = [
        p for p in env.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p and os.path.normpath(p) != root
    ]
    extra = env.get("TRITON_APPEND_CMAKE_ARGS", "")
    ignore = f"-DCMAKE_IGNORE_PREFIX_PATH={root}"
    return {
        "CMAKE_PREFIX_PATH": os.pathsep.join(kept),
        "TRITON_APPEND_CMAKE_ARGS": extra if ignore in shlex.split(extra) else f"{extra} {ignore}".strip(),
    }


RECIPE = Triton()
