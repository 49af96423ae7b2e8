"""Any PEP 517 project: its declared build requirements, ``python -m build`` without isolation.

Options (``[packages.NAME.options]``), so a package that only needs data gets no recipe of its own:
- ``requirements_files``: requirements files in the project (e.g. ``["requirements.txt"]``)
  installed into the build venv besides ``[build-system].requires``;
- ``build_requires``: more requirements for the build venv (e.g. ``["pyyaml"]``);
- ``arch_variables``: variables set to the package's arch list, ``;``-separated, for builds
  that do not read ``PYTORCH_ROCM_ARCH`` (flash-attention's and aiter's ``GPU_ARCHS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rocmforge.build.recipes import Context, pyproject_build_requires, read_requirements
from rocmforge.config import require_package_archs
from rocmforge.errors import UserError

# PEP 517's fallback when a project declares no [build-system] (pip and build use the same).
_LEGACY_BUILD_REQUIRES = ["setuptools>=40.8.0", "wheel"]


class Generic:
    """The default recipe; the package recipes subclass it and override what differs."""

    name = "generic"
    # Variables of environment() that say where this builder keeps an input (a cache, an LLVM),
    # not what it is: left out of the wheel's record and fingerprint, like PATH.
    location_variables: tuple[str, ...] = ()

    def project_dir(self, checkout) -> Path:
        """The directory holding ``pyproject.toml`` or ``setup.py``."""
        return Path(checkout.project_dir)

    def build_requirements(self, ctx: Context) -> list[str]:
        """What the build venv needs besides the dependencies' wheels."""
        root = self.project_dir(ctx.checkout)
        declared = pyproject_build_requires(root)
        listed = []
        for i, name in enumerate(_strings(ctx, "requirements_files")):
            if not (root / name).is_file():
                raise UserError(
                    f"packages.{ctx.package.name}.options.requirements_files[{i}]: {name} is not in the "
                    f"source tree ({root})"
                )
            listed += read_requirements(root / name)
        extra = _strings(ctx, "build_requires")
        return ["build", *(_LEGACY_BUILD_REQUIRES if declared is None else declared), *listed, *extra]

    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        """Variables this recipe adds to (or replaces in) ``env``, the generic build environment
        :func:`rocmforge.build.environment.build_environment` made so far; the config's ``env``
        comes later."""
        names = _strings(ctx, "arch_variables")
        if not names or ctx.cfg.build.backend != "rocm":
            return {}
        archs = ";".join(require_package_archs(ctx.cfg, ctx.package))
        return dict.fromkeys(names, archs)

    def prepare_commands(self, ctx: Context) -> list[list[str]]:
        """Commands run in the project directory before the build (code generation, hipify)."""
        return []

    def build_command(self, ctx: Context) -> list[str]:
        """The build itself; it must leave exactly one wheel in ``ctx.dist_dir``."""
        # No isolation: the build venv *is* the isolation, holding our wheels rather than
        # PyPI's. -x: the recipe decided the requirements (e.g. our torch instead of the pinned
        # PyPI one), so build's own check against pyproject.toml would wrongly refuse.
        return [str(ctx.python), "-m", "build", "--wheel", "--no-isolation", "-x", "-o", str(ctx.dist_dir)]

    def stale_paths(self, ctx: Context) -> list[Path]:
        """In-tree outputs a previous build leaves behind, removed before a changed build."""
        root = self.project_dir(ctx.checkout)
        return [root / "build", root / "dist", *root.glob("*.egg-info")]

    def dropped_requirements(self, ctx: Context) -> set[str]:
        """Projects whose ``Requires-Dist`` lines the finished wheel must lose."""
        return set()

    def native_local_version(self, ctx: Context) -> bool:
        """Whether the build itself applies ``local_version`` (else the wheel is relabelled)."""
        return False


def _strings(ctx: Context, option: str) -> list[str]:
    """A list-of-strings option, or a one-line error naming the key."""
    value = ctx.option(option, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"packages.{ctx.package.name}.options.{option}: expected an array of strings")
    return value


RECIPE = Generic()
