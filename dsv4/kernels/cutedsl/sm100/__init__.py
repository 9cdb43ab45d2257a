"""sm_100a (Blackwell B200) NVFP4 kernels: ``tcgen05`` block-scaled MMAs (``kind::mxf4nvf4``,
E4M3 scales per 16 elements) written in CuTe DSL.

Compiled and PTX-checked on CPU machines; no B200 was available to execute them here, so results
from this backend exist only where a B200 ran the ``gpu``/``sm100`` tests.

* ``Sm100Backend(device)``: the contract's ``gemm`` / ``grouped_gemm`` / ``quantize_activation``.
* ``compile_for_check() -> list[KernelBuild]``: compile every configuration for sm_100a, keep PTX.

Importing this package does not import ``cutlass``.
"""
from __future__ import annotations

from .backend import LaunchArgs, Sm100Backend

__all__ = ["Sm100Backend", "LaunchArgs", "compile_for_check"]


def compile_for_check(*args, **kwargs):
    """See ``compile.compile_for_check`` (imported lazily: it loads ``cutlass``)."""
    from .compile import compile_for_check as _impl

    return _impl(*args, **kwargs)
