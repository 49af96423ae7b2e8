"""Triton (ROCm/triton for ROCm): ``python/`` or root ``setup.py`` depending on the version.

Options (``[packages.triton.options]``):
- ``llvm_syspath``, ``json_syspath``: local LLVM build and nlohmann-json headers; with both set
  the build is offline (``TRITON_OFFLINE_BUILD=1``) and downloads nothing.

Triton downloads LLVM and other tools into ``TRITON_HOME`` (``<cache_dir>/triton``), shared by
every build of this user.
"""

from __future__ import annotations

from pathlib import Path

from rocmforge.errors import UserError
from rocmforge.recipes import Context, read_requirements
from rocmforge.recipes.generic import Generic


class Triton(Generic):
    name = "triton"

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

    def environment(self, ctx: Context) -> dict[str, str]:
        env = {
            "TRITON_HOME": str(ctx.cfg.build.cache_dir / "triton"),
            "TRITON_BUILD_WITH_CCACHE": "true" if ctx.cfg.build.compile_cache == "ccache" else "false",
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
            env.update(TRITON_OFFLINE_BUILD="1", LLVM_SYSPATH=str(llvm), JSON_SYSPATH=str(json_dir))
        return env


RECIPE = Triton()
