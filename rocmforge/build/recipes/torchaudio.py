"""torchaudio (pytorch/audio): ``BUILD_VERSION`` and ``PYTORCH_VERSION`` like torchvision, and its
``requirements.txt`` in the build venv (vLLM's Dockerfile installs it before the build).

``USE_ROCM``/``USE_CUDA`` come from the build environment; its CMake extension reads them.
"""

from __future__ import annotations

from rocmforge.build.recipes import Context, read_requirements
from rocmforge.build.recipes.torchvision import TorchDomainLibrary


class TorchAudio(TorchDomainLibrary):
    name = "torchaudio"

    def build_requirements(self, ctx: Context) -> list[str]:
        declared = super().build_requirements(ctx)
        listed = self.project_dir(ctx.checkout) / "requirements.txt"
        return [*declared, *read_requirements(listed)] if listed.is_file() else declared


RECIPE = TorchAudio()
