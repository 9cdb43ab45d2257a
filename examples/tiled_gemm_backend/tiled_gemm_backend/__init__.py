"""An example NVFP4 backend package for dsv4-parity (docs/your-kernel.md).

``register()`` is the entry point (group ``dsv4_parity.backends``, pyproject.toml): dsv4-parity calls
it when it resolves ``--backend``, so after ``pip install -e examples/tiled_gemm_backend`` the name
``tiled_gemm`` works in every command. Priority -1: it is chosen by name, never by ``--backend auto``.
"""
from __future__ import annotations

import os

from .kernel import BUG_ENV, TiledGemmBackend


def register() -> None:
    from dsv4.kernels.registry import register_backend

    register_backend("tiled_gemm", lambda device: TiledGemmBackend(bug=os.environ.get(BUG_ENV, "")),
                     supports=lambda d: d.type in ("cpu", "cuda"), priority=-1,
                     note="example package (examples/tiled_gemm_backend)")


__all__ = ["BUG_ENV", "TiledGemmBackend", "register"]
