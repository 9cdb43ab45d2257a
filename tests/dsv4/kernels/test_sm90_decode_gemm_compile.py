"""CPU tier of the sm_90a decode GEMM (``decode_gemm_kernel.py``): every shape class compiles for
sm_90a with placeholder pointers and its PTX holds what the design promises — mbarrier-guarded
ring, bulk async copies of the rows, cp.async scale copies tracked by the mbarrier, warp-level
FP16 MMA with FP32 accumulation, the exact E2M1 x E4M3 decode (no sm_100 FP4 instruction), and no
local-memory traffic (the accumulators stay in registers). With ``ptxas`` on the PATH, also no
spills and the register count leaves room for two CTAs per SM.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import pytest

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")

# name -> DecodeConfig kwargs
VARIANTS = {
    "n8_bk256": dict(ntok=8),
    "n16_bk256": dict(ntok=16),
    "n8_bk256_swiglu": dict(ntok=8, swiglu=True),
    "n16_bk128_s6_swiglu": dict(ntok=16, bk=128, stages=6, swiglu=True),
    "n16_w8_s8": dict(ntok=16, consumer_warps=8, stages=8),
    "n8_rows64_swiglu": dict(ntok=8, rows=64, swiglu=True),
    "grouped_n8_swiglu": dict(ntok=8, grouped=True, swiglu=True),
    "n16_rows256_s4": dict(ntok=16, rows=256, stages=4),
    "grouped_n16": dict(ntok=16, grouped=True),
}


@pytest.fixture(scope="module")
def builds():
    from dsv4.kernels.cutedsl.sm90.decode_gemm_kernel import DecodeConfig
    from dsv4.kernels.cutedsl.sm90.decode_launch import compile_decode_gemm

    out = {}
    for name, kw in VARIANTS.items():
        cfg = DecodeConfig(**kw)
        _, ptx, _ = compile_decode_gemm(cfg, "sm_90a", keep_ptx=True)
        out[name] = (cfg, ptx)
    return out


@needs_cutlass
@pytest.mark.parametrize("name", list(VARIANTS))
def test_decode_gemm_ptx_census(builds, name):
    cfg, ptx = builds[name]
    assert ".target sm_90a" in ptx
    # ring protocol: 2 mbarriers per stage, waits, expect_tx, consumer releases
    assert len(re.findall(r"mbarrier\.init\.shared::cta\.b64", ptx)) == 2 * cfg.stages
    assert len(re.findall(rf"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], {32 * cfg.row_groups};", ptx)) == cfg.stages
    assert re.search(r"mbarrier\.try_wait\.parity", ptx)
    assert re.search(r"mbarrier\.arrive\.expect_tx", ptx)
    assert re.search(r"mbarrier\.arrive\.shared::cta\.b64", ptx)
    assert re.search(r"cp\.async\.mbarrier\.arrive\.noinc", ptx)
    # weights through the TMA engine with an L2 evict-first policy; tokens without the hint
    assert re.search(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes\.L2::cache_hint", ptx)
    assert re.search(r"createpolicy\.fractional\.L2::evict_first", ptx)
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 4,", ptx)
    # MMA: 4 m16 fragments x (ntok/8) n8 tiles x 2 k16-steps x 4 words x quads per stage
    mmas = len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", ptx))
    assert mmas == 4 * cfg.nt * 2 * 4 * cfg.qpt
    assert "wgmma" not in ptx
    # decode: one mul.rn.f16x2 per f16x2 word; (8 weight rows + nt tokens) x 4 words x 4 per quad
    assert ptx.count("mul.rn.f16x2") == (8 + cfg.nt) * 4 * 4 * cfg.qpt
    assert ptx.count("prmt.b32 t, m0, 0, 0x1404") == (8 + cfg.nt) * 4 * cfg.qpt  # decode8_pairs
    assert not re.search(r"mul(\.[a-z0-9]+)*\.ftz[a-z0-9.]*\.f16x2", ptx)
    assert re.search(r"cvt\.rn\.f16x2\.e4m3x2", ptx)
    assert not re.search(r"cvt\.[a-z0-9.]*e2m1x2", ptx) and "tcgen05" not in ptx
    if cfg.grouped:  # the device-side token-tile schedule (block scan of the offsets)
        assert re.search(r"shfl\.sync\.up", ptx)
    # split-K counter protocol and no local memory
    assert re.search(r"atom\.[a-z_.]*add", ptx)
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    assert cfg.smem_bytes() <= 227 * 1024


@needs_cutlass
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")
@pytest.mark.parametrize("name", ["n8_bk256", "n16_bk256", "n8_bk256_swiglu", "grouped_n8_swiglu"])
def test_decode_gemm_ptxas_no_spills(builds, name, tmp_path):
    _, ptx = builds[name]
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    info = r.stdout + r.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", info), info
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    assert regs <= 168, regs  # 2 CTAs x 160 threads fit the 64K-register file


def test_decode_plan_covers_the_sms_without_empty_splits():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.decode_launch import decode_plan

    for m, n, k, sw in [(1, 7168, 2048, False), (4, 6144, 7168, True), (16, 4096, 7168, False),
                        (16, 129280, 7168, False), (1, 1536, 7168, False), (3, 40, 96, True), (9, 130, 32, False)]:
        p = decode_plan(m, n, k, swiglu=sw, num_sms=132)
        assert p.cfg.ntok == (8 if m <= 8 else 16)
        k_tiles = -(-k // p.cfg.bk)
        per = -(-k_tiles // p.splits)
        assert (p.splits - 1) * per < k_tiles, "an empty split"
        assert p.tiles * p.cfg.col_tile >= (n // 2 if sw else n)
        # at least ~half the resident CTA slots, unless limited by k-tiles or the split cap
        assert p.ctas >= min(132, p.tiles * k_tiles) or p.splits == 16, p
    # grouped: 4 tokens x 6 experts of 384 -> 24 rows: ntok 8, slots = 24 // 8 + 24
    p = decode_plan(24, 6144, 7168, swiglu=True, num_sms=132, num_experts=384)
    assert p.cfg.grouped and p.cfg.ntok == 8 and p.slots == 27 and p.splits == 1
    assert decode_plan(40 * 16, 512, 1024, swiglu=False, num_sms=132, num_experts=16).cfg.ntok == 16


# ----------------------------------------------------------------------------- the decode's PTX, interpreted
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
    import struct

    import numpy as np

    def halves(w):
        return np.frombuffer(struct.pack("<I", w), dtype=np.float16)

    r = (halves(a).astype(np.float32) * halves(b).astype(np.float32)).astype(np.float16)
    return struct.unpack("<I", r.tobytes())[0]


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
    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [t.strip() for t in rest.split(",")]
        dst, srcs = args[0], [val(t) for t in args[1:]]
        if op == "and.b32":
            r = srcs[0] & srcs[1]
        elif op == "shr.u32":
            r = srcs[0] >> srcs[1]
        elif op == "shl.b32":
            r = (srcs[0] << srcs[1]) & 0xFFFFFFFF
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
        if dst.startswith("{$w"):
            outs[int(dst[3:-1])] = r
        else:
            regs[dst] = r
    return outs


@needs_cutlass
def test_decode8_pairs_ptx_is_bit_exact_and_equals_the_wgmma_kernels_values():
    """Every nibble pattern decodes to its E2M1 value times the scale (sign of -0 kept) in the order
    (n0,n1 | n2,n3 | n4,n5 | n6,n7), and the multiset of FP16 words equals ptx.decode_e2m1x8's."""
    import random
    import struct

    import numpy as np

    from dsv4.kernels.cutedsl.sm90 import decode_ptx, ptx

    one, quarter, tiny = 0x3C003C00, 0x34003400, 0x18001800  # scales 1, 0.25, 2^-9 (e4m3 min subnormal)
    rng = random.Random(0)
    words = list(range(0, 1 << 16, 7)) + [(w << 16) | w for w in range(0, 1 << 16, 251)]
    words += [rng.getrandbits(32) for _ in range(3000)]
    for scale_word, scale in ((one, 1.0), (quarter, 0.25), (tiny, 2.0 ** -9)):
        for x in words:
            out = _run_ptx(decode_ptx.DECODE8_PAIRS, [x, scale_word], 4)
            vals = np.frombuffer(struct.pack("<4I", *out), dtype=np.float16)
            for i, v in enumerate(vals):
                nib = (x >> (4 * i)) & 0xF
                want = E2M1[nib & 7] * scale * (-1 if nib & 8 else 1)
                assert float(v) == want and bool(np.signbit(v)) == bool(nib & 8), (hex(x), i)
            old = _run_ptx(ptx._DECODE8, [x, scale_word], 4)
            halves = sorted(struct.unpack("<8H", struct.pack("<4I", *out)))
            assert halves == sorted(struct.unpack("<8H", struct.pack("<4I", *old)))
