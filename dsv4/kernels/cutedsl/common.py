"""Host-side pieces shared by the sm_90a and sm_100a CuTe DSL kernels.

* ``KernelBuild``: one compiled kernel as reported by an arch package's ``compile_for_check()``
  (consumed by ``dsv4.kernels.compile_check`` and the compile tests).
* ``KernelCache``: ``cute.compile`` never caches (spec §1.5), so executors are kept per
  (arch, shape class, dtypes, epilogue) key.
* Validation helpers that add kernel-specific limits on top of the contract's ``validate()``.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

from ..contract import KernelContractError, capturing  # noqa: F401  (capturing: re-exported for the kernels)


@dataclass
class KernelBuild:
    """One kernel compiled for one arch, with the PTX it produced.

    ``required``: regexes that must each match the PTX at least once (e.g. ``r"wgmma\\.mma_async"``);
    ``forbidden``: regexes that must not match (e.g. ``r"cvt\\.[^;]*e2m1x2"`` on sm_90a).
    ``error`` is set (and ``ptx`` empty) when compilation failed.
    """

    name: str
    arch: str
    ptx: str
    seconds: float
    required: list[str] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)
    error: str | None = None

    def census(self) -> dict[str, int]:
        """Number of PTX matches of every required and forbidden pattern."""
        return {p: len(re.findall(p, self.ptx)) for p in (*self.required, *self.forbidden)}

    def problems(self) -> list[str]:
        """Why this build fails the pre-flight; empty when it passes."""
        if self.error is not None:
            return [f"compile failed: {self.error}"]
        out = [f"missing required PTX /{p}/" for p in self.required if not re.search(p, self.ptx)]
        out += [f"forbidden PTX /{p}/ present" for p in self.forbidden if re.search(p, self.ptx)]
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


_SHARED_STORES: dict[Hashable, dict[Hashable, object]] = {}
_SHARED_LOCK = threading.Lock()


class KernelCache:
    """Compiled executors keyed by (arch, shape class, dtypes, epilogue, ...). Thread-safe.

    ``scope=None``: this instance's own store. With a ``scope`` (e.g. ``("sm90-gemm", "cuda:0")``)
    every cache of that scope in the process shares one store, so a model loaded again (each column,
    each DSpark pair, each bug-zoo row loads its own) does not compile its kernels again: a compile
    costs seconds, a tiny forward milliseconds. ``compiles`` counts what this instance built."""

    def __init__(self, scope: Hashable | None = None) -> None:
        if scope is None:
            self._store: dict[Hashable, object] = {}
            self._lock = threading.Lock()
        else:
            with _SHARED_LOCK:
                self._store = _SHARED_STORES.setdefault(scope, {})
            self._lock = _SHARED_LOCK
        self.compiles = 0

    def get(self, key: Hashable, build: Callable[[], object]) -> object:
        with self._lock:
            hit = self._store.get(key)
            if hit is not None:
                return hit
            exe = build()
            self._store[key] = exe
            self.compiles += 1
            return exe

    def __len__(self) -> int:
        return len(self._store)


def expect(cond: bool, what: str, expected: str, found: object) -> None:
    """Raise a ``KernelContractError`` naming expected vs found unless ``cond``."""
    if not cond:
        raise KernelContractError(f"{what}: expected {expected}, found {found}")


def check_cuda(t: torch.Tensor, what: str) -> None:
    expect(t.is_cuda, f"{what} device", "a CUDA tensor", t.device)


def check_align(t: torch.Tensor, what: str, align: int) -> None:
    """Vector loads / ``cp.async`` need the base address aligned to ``align`` bytes."""
    expect(t.data_ptr() % align == 0, f"{what} data pointer", f"{align}-byte aligned",
           f"address % {align} = {t.data_ptr() % align}")


def swizzle_linear_scales(s: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """Linear ``[groups * R, S]`` scales -> flat 32_4_4 layout, swizzled per group (zero padding).

    Independent of ``dsv4.numerics.swizzle_scales`` on purpose (tests compare the two): rows
    ``128*mt + 32*r1 + r0`` and columns ``4*kt + c`` go to ``((mt*(S_pad/4) + kt)*32 + r0)*16 + r1*4 + c``.
    """
    rows, cols = int(s.shape[0]) // groups, int(s.shape[1])
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    u = s.view(torch.uint8).reshape(groups, rows, cols)
    padded = torch.zeros((groups, rp, cp), dtype=torch.uint8, device=s.device)
    padded[:, :rows, :cols] = u
    t = padded.reshape(groups, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return t.reshape(-1).view(torch.float8_e4m3fn)


def kernel_scales(op, groups: int = 1) -> torch.Tensor:
    """The operand's scales in the swizzled layout the CuTe DSL kernels read (converted at the edge
    when given linear; a per-call cost: pass swizzled weights, converted once at load time)."""
    if op.scale_layout == "swizzled":
        return op.scales
    return swizzle_linear_scales(op.scales, groups)


def gmem_ptr(t: torch.Tensor, dtype, align: int = 16):
    """A CuTe global-memory pointer to a torch tensor's data (no copy)."""
    from cutlass import cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def fake_gmem_ptr(dtype, align: int = 16):
    """A placeholder pointer for compiling without a GPU (its value is never used)."""
    from cutlass import cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(dtype, align, cute.AddressSpace.gmem, assumed_align=align)


def cu_stream(device: torch.device):
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def compile_with_ptx(fn, *args, arch: str):
    """``cute.compile`` for ``arch`` keeping the PTX; returns ``(executor, ptx_text, seconds)``."""
    import tempfile
    import time

    import cutlass.cute as cute

    with tempfile.TemporaryDirectory(prefix="dsv4_cute_") as d:
        t0 = time.perf_counter()
        exe = cute.compile(fn, *args, options=f"--gpu-arch {arch} --keep-ptx --dump-dir {d}")
        secs = time.perf_counter() - t0
        ptx = exe.artifacts.PTX or ""
        if ptx and not ptx.lstrip().startswith("//") and "\n" not in ptx:  # a path, not the text
            with open(ptx) as f:
                ptx = f.read()
    return exe, ptx, secs


def compile_executor(fn, *args, arch: str):
    """``cute.compile`` for ``arch`` (no artifacts)."""
    import cutlass.cute as cute

    return cute.compile(fn, *args, options=f"--gpu-arch {arch}")


def compile_placeholder(fn, arg_types, scalars, *, arch: str, keep_ptx: bool = False):
    """Compile the ``@cute.jit`` launcher ``fn`` with placeholder pointers (``arg_types``: (dtype, assumed
    alignment) per pointer argument, in order), then ``scalars`` and a null stream; runtime values are
    arguments, so one compile serves every shape. ``keep_ptx``: as ``compile_with_ptx``."""
    import cuda.bindings.driver as cuda

    args = (fn, *[fake_gmem_ptr(dt, al) for dt, al in arg_types], *scalars, cuda.CUstream(0))
    if keep_ptx:
        return compile_with_ptx(*args, arch=arch)
    return compile_executor(*args, arch=arch)


def check_build(name: str, arch: str, compile_ptx: Callable[[], tuple], required: list[str],
                forbidden: list[str]) -> KernelBuild:
    """A pre-flight ``KernelBuild`` from ``compile_ptx() -> (executor, ptx, seconds)``; a compile error
    becomes ``KernelBuild.error``."""
    try:
        _, ptx, secs = compile_ptx()
        return KernelBuild(name, arch, ptx, secs, list(required), list(forbidden))
    except Exception as e:
        return KernelBuild(name, arch, "", 0.0, list(required), list(forbidden), error=f"{type(e).__name__}: {e}")


class LaunchResources:
    """Per-device state of a GEMM launcher (``self.device``): the SM count, read once, and zeroed
    int32 split-K tile counters, grown on demand (the kernels leave them zero after every launch)."""

    device: torch.device
    _counters: torch.Tensor | None = None
    _num_sms: int | None = None

    def _sms(self) -> int:
        if self._num_sms is None:
            self._num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        return self._num_sms

    def _tile_counters(self, n: int, device: torch.device) -> torch.Tensor:
        if self._counters is None or self._counters.numel() < n or self._counters.device != device:
            self._counters = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        return self._counters

    def _split_k_buffers(self, splits: int, floats: int, tiles: int, device: torch.device,
                         unused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(FP32 partials workspace, tile counters) of a split-K launch; without split-K the kernel never
        dereferences them, and ``unused`` (any tensor of the call) stands in for both."""
        if splits <= 1:
            return unused, unused
        return torch.empty(floats, dtype=torch.float32, device=device), self._tile_counters(tiles, device)
