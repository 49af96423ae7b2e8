"""Per-package build knowledge, one small module per package, everything else generic.

A recipe answers five questions for :mod:`rocmforge.build.package`: which directory holds the project,
what must be installed in the build venv, which extra environment the build needs, which
commands run before and for the build, and which ``Requires-Dist`` lines the finished wheel
must lose. :class:`~rocmforge.build.recipes.generic.Generic` answers them for any PEP 517 project;
``pytorch``, ``triton``, ``torchvision``, ``torchaudio`` and ``vllm`` override what differs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from rocmforge.build.recipes.generic import Generic
    from rocmforge.config import Config, Package


@dataclass(frozen=True)
class Context:
    """What a recipe may look at: the config, the package, its checkout and the build venv."""

    cfg: Config
    package: Package
    checkout: object | None  # rocmforge.sources.checkout.Checkout; None for a prebuilt wheel
    python: Path  # the build venv's interpreter
    dist_dir: Path  # where the build must leave its wheel
    dependencies: Mapping[str, Path]  # configured dependency name -> its wheel in the wheelhouse

    @property
    def option(self):
        """``packages.NAME.options`` lookup with a default: ``ctx.option("rust_frontend", "auto")``."""
        return self.package.options.get

    @property
    def version(self) -> str | None:
        """The version being built: ``packages.NAME.version``, else the one the checkout declares."""
        return self.package.version or getattr(self.checkout, "version", None)

    @property
    def pins(self) -> dict[str, str]:
        """Project -> version of each direct dependency's wheel this package must require at ``==``.

        A package built against our wheels names exactly those wheels, so no later install can
        swap one (``packages.NAME.unpinned_depends`` lists the exceptions). Recipes whose build
        has its own switch for this pass it on (PyTorch's ``PYTORCH_EXTRA_INSTALL_REQUIREMENTS``);
        the wheel fixup adds whatever the build did not write.
        """
        from rocmforge.build.wheelfile import wheel_name

        pkg = self.package
        pinned = [d for d in pkg.depends if d not in pkg.unpinned_depends and d in self.dependencies]
        names = [wheel_name(self.dependencies[d]) for d in pinned]
        return {n.project: n.version for n in names}

    def builds_own(self, recipe: str) -> bool:
        """Whether the config builds a package with ``recipe`` from source (not prebuilt)."""
        return any(p.recipe == recipe and p.source is not None for p in self.cfg.packages.values())


def get(name: str) -> Generic:
    """The recipe called ``name`` (a module in this package with a ``RECIPE`` object)."""
    return importlib.import_module(f"rocmforge.build.recipes.{name}").RECIPE


def read_requirements(path: Path) -> list[str]:
    """Requirement lines of a pip requirements file, following ``-r``; options and comments dropped."""
    result: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            result += read_requirements(path.parent / line.split(None, 1)[1])
        elif not line.startswith("-"):
            result.append(line)
    return result


def pyproject_build_requires(project_dir: Path) -> list[str] | None:
    """``[build-system].requires`` of ``project_dir/pyproject.toml``; None when not declared."""
    path = project_dir / "pyproject.toml"
    if not path.is_file():
        return None
    system = tomllib.loads(path.read_text()).get("build-system", {})
    return list(system["requires"]) if "requires" in system else None
