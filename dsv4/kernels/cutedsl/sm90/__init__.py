"""sm_90a (Hopper) NVFP4 kernels: FP4 decoded in-kernel to FP16, WGMMA with FP32 accumulation.

``Sm90Backend(device)`` implements the kernel contract; ``compile_for_check()`` compiles every
kernel for sm_90a with placeholder pointers (no GPU needed) for the pre-flight and the CI tests.
Importing this package imports ``cutlass`` (the ``cutedsl`` extra).
"""
from .backend import Sm90Backend
from .compile import compile_for_check

__all__ = ["Sm90Backend", "compile_for_check"]
