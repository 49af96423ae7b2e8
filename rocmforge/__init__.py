"""rocmforge: build PyTorch, Triton, vLLM (and friends) from pinned sources for AMD ROCm GPUs."""

__version__ = "0.1.0"
