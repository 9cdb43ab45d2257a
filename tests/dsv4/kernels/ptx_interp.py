"""A tiny interpreter of the integer PTX subset the E2M1 decodes use (and, shr, shl, prmt, lop3,
mul.rn.f16x2): one word at a time, and vectorized over numpy uint32 arrays. Shared by the compile tests
of the sm_90a kernels; imported by path (pytest runs in importlib mode)."""
from __future__ import annotations

import struct

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _prmt(a: int, b: int, c: int) -> int:
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = src[sel & 7]
        if sel & 8:  # replicate the sign bit of the selected byte
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * i)
    return out


def _f16_mul(a: int, b: int) -> int:
    """mul.rn.f16x2 via numpy float16 (IEEE round to nearest)."""
    import numpy as np

    def halves(w):
        return np.frombuffer(struct.pack("<I", w), dtype=np.float16)

    r = (halves(a).astype(np.float32) * halves(b).astype(np.float32)).astype(np.float16)
    return struct.unpack("<I", r.tobytes())[0]


def _statements(text: str):
    """(op, destination, source tokens) of each instruction of an inline-PTX block."""
    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [t.strip() for t in rest.split(",")]
        yield op, args[0], args[1:]


def _store(outs: list, regs: dict, dst: str, r) -> None:
    """An output operand ``{$wN}`` or a named register."""
    if dst.startswith("{$w"):
        outs[int(dst[3:-1])] = r
    else:
        regs[dst] = r


def _run_ptx(text: str, inputs: list[int], n_out: int) -> list[int]:
    """Interpret the integer subset of PTX the decode uses (and, shr, shl, prmt, lop3, mul.rn.f16x2)."""
    regs: dict[str, int] = {}

    def val(tok: str) -> int:
        tok = tok.strip()
        if tok.startswith("{$r"):
            return inputs[int(tok[3:-1])]
        if tok.startswith("0x") or tok.isdigit():
            return int(tok, 0)
        return regs[tok]

    outs = [0] * n_out
    for op, dst, toks in _statements(text):
        srcs = [val(t) for t in toks]
        m = 0xFFFFFFFF
        if op == "and.b32":
            r = srcs[0] & srcs[1]
        elif op == "shr.u32":
            r = srcs[0] >> srcs[1]
        elif op == "shl.b32":
            r = (srcs[0] << srcs[1]) & m
        elif op == "prmt.b32":
            r = _prmt(*srcs)
        elif op == "lop3.b32":
            a, b, c, lut = srcs
            r = 0
            for bit in range(32):
                idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
                r |= ((lut >> idx) & 1) << bit
        elif op == "mul.rn.f16x2":
            r = _f16_mul(srcs[0], srcs[1])
        else:
            raise AssertionError(f"unexpected PTX op {op}")
        _store(outs, regs, dst, r)
    return outs


def _run_ptx_np(text: str, inputs: list, n_out: int) -> list:
    """``_run_ptx`` over numpy uint32 arrays (one lane per element)."""
    import numpy as np

    regs: dict = {}
    shape = np.broadcast(*[np.asarray(v) for v in inputs]).shape

    def val(tok: str):
        tok = tok.strip()
        if tok.startswith("{$r"):
            return np.broadcast_to(np.asarray(inputs[int(tok[3:-1])], dtype=np.uint32), shape)
        if tok.startswith("0x") or tok.isdigit():
            return np.full(shape, int(tok, 0), dtype=np.uint32)
        return regs[tok]

    def f16(w):
        return (w & 0xFFFF).astype(np.uint16).view(np.float16), (w >> 16).astype(np.uint16).view(np.float16)

    outs = [None] * n_out
    for op, dst, toks in _statements(text):
        srcs = [val(t) for t in toks]
        if op == "and.b32":
            r = srcs[0] & srcs[1]
        elif op == "shr.u32":
            r = srcs[0] >> srcs[1]
        elif op == "shl.b32":
            r = (srcs[0].astype(np.uint64) << srcs[1].astype(np.uint64)).astype(np.uint32)
        elif op == "lop3.b32":
            a, b, c, lut = srcs
            r = np.zeros(shape, dtype=np.uint32)
            for idx in range(8):
                if (int(lut.flat[0]) >> idx) & 1:
                    r |= ((a if idx & 4 else ~a) & (b if idx & 2 else ~b) & (c if idx & 1 else ~c))
        elif op == "prmt.b32":
            a, b, c = srcs
            src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
            r = np.zeros(shape, dtype=np.uint32)
            for i in range(4):
                sel = (c >> (4 * i)) & 0xF
                byte = np.choose((sel & 7).astype(np.intp), src)
                byte = np.where(sel & 8, np.where(byte & 0x80, 0xFF, 0), byte).astype(np.uint32)
                r |= byte << (8 * i)
        elif op == "mul.rn.f16x2":  # products of two f16 are exact in f32: one rounding to f16
            (al, ah), (bl, bh) = f16(srcs[0]), f16(srcs[1])
            lo = (al.astype(np.float32) * bl.astype(np.float32)).astype(np.float16).view(np.uint16)
            hi = (ah.astype(np.float32) * bh.astype(np.float32)).astype(np.float16).view(np.uint16)
            r = lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)
        else:
            raise AssertionError(f"unexpected PTX op {op}")
        _store(outs, regs, dst, r)
    return outs
