"""The two toolkit roots vLLM's setup.py imports; a CPU-only torch has neither."""

CUDA_HOME = None
ROCM_HOME = None
