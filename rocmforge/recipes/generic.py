"""Any PEP 517 project: its declared build requirements, ``python -m build`` without isolation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rocmforge.recipes import Context, pyproject_build_requires

# PEP 517's fallback when a project declares no [build-system] (pip and build use the same).
_LEGACY_BUILD_REQUIRES = ["setuptools>=40.8.0", "wheel"]


class Generic:
    """The default recipe; the package recipes subclass it and override what differs."""

    name = "generic"

    def project_dir(self, checkout) -> Path:
        """The directory holding ``pyproject.toml`` or ``setup.py``."""
        return Path(checkout.project_dir)

    def build_requirements(self, ctx: Context) -> list[str]:
        """What the build venv needs besides the dependencies' wheels."""
        declared = pyproject_build_requires(self.project_dir(ctx.checkout))
        return ["build", *(_LEGACY_BUILD_REQUIRES if declared is None else declared)]

    def environment(self, ctx: Context, env: Mapping[str, str]) -> dict[str, str]:
        """Variables this recipe adds to (or replaces in) ``env``, the generic build environment
        :func:`rocmforge.buildenv.build_environment` made so far; the config's ``env`` comes later."""
        return {}

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


RECIPE = Generic()
