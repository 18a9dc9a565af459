"""Triton kernels (each `@triton.jit` function sits apart from its launcher) and the alignment."""
