"""Not PyTorch: a stand-in for building vLLM with ``VLLM_TARGET_DEVICE=empty`` (no kernels).

vLLM's setup.py reads ``torch.version.{cuda,hip,xpu}``, ``torch.__version__`` and
``torch.utils.cpp_extension.{CUDA_HOME,ROCM_HOME}``; nothing is compiled against it.
"""

from torch import version

__version__ = version.__version__
