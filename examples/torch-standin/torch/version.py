"""What ``torch.version`` tells a build: no CUDA, no ROCm, no XPU (a CPU-only torch says the same)."""

__version__ = "0.0.0+standin"
cuda = None
hip = None
xpu = None
