"""CPU tier of the sm_90a decode GEMM (``decode_gemm_kernel.py``): every shape class compiles for
sm_90a with placeholder pointers and its PTX holds what the design promises — mbarrier-guarded
ring, bulk async copies of the rows, cp.async scale copies tracked by the mbarrier, warp-level
FP16 MMA with FP32 accumulation, the exact E2M1 x E4M3 decode (no sm_100 FP4 instruction), and no
local-memory traffic (the accumulators stay in registers). With ``ptxas`` on the PATH, also no
spills and the register count leaves room for two CTAs per SM.
"""
from __future__ import annotations

import importlib.util
import sys
import re
import shutil
import subprocess

from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))   # the PTX interpreter beside this file
from ptx_interp import E2M1, _run_ptx, _run_ptx_np  # noqa: E402

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
    "n8_copy16": dict(ntok=8, copy16=True),
    "n16_copy16_reduce_ilp": dict(ntok=16, copy16=True, reduce_ilp=True),
    "grouped_n16_bk128_s6_copy16_swiglu": dict(ntok=16, bk=128, stages=6, grouped=True, swiglu=True, copy16=True),
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
    if cfg.copy16:  # weights by the lanes in 16-byte chunks (one per lane per row segment), tokens by TMA
        from dsv4.kernels.cutedsl.sm90.decode_gemm_kernel import COPY16_UNROLL

        assert len(re.findall(r"cp\.async\.cg\.shared\.global\.L2::256B \[[^]]+\], \[[^]]+\], 16,", ptx)) == \
            COPY16_UNROLL   # an unrolled loop over the rows * (bk/32) / 32 chunk rounds
        assert "L2::cache_hint" not in ptx and re.search(r"cp\.async\.bulk\.shared::cluster", ptx)
    else:  # weights through the TMA engine with an L2 evict-first policy; tokens without the hint
        assert re.search(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes\.L2::cache_hint", ptx)
        assert re.search(r"createpolicy\.fractional\.L2::evict_first", ptx)
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 4,", ptx)
    # MMA: 4 m16 fragments x (ntok/8) n8 tiles x 2 k16-steps x 4 words x quads per stage
    mmas = len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", ptx))
    assert mmas == 4 * cfg.nt * 2 * 4 * cfg.qpt
    assert "wgmma" not in ptx
    # decode: one mul.rn.f16x2 per f16x2 word; (8 weight rows + nt tokens) x 4 words x 4 per quad
    assert ptx.count("mul.rn.f16x2") == (8 + cfg.nt) * 4 * 4 * cfg.qpt
    assert ptx.count("lop3.b32 t, a, xo, 0x8E008E00, 0xA8;") == (8 + cfg.nt) * 4 * cfg.qpt  # DECODE8_REBIAS
    assert "prmt.b32 t, m0, 0, 0x1404" not in ptx  # the former table decode is gone
    assert not re.search(r"mul(\.[a-z0-9]+)*\.ftz[a-z0-9.]*\.f16x2", ptx)
    assert re.search(r"cvt\.rn\.f16x2\.e4m3x2", ptx)
    assert not re.search(r"cvt\.[a-z0-9.]*e2m1x2", ptx) and "tcgen05" not in ptx
    if cfg.grouped:  # the device-side token-tile schedule (block scan of the offsets)
        assert re.search(r"shfl\.sync\.up", ptx)
    # split-K counter protocol and no local memory
    assert re.search(r"atom\.[a-z_.]*add", ptx)
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    assert cfg.smem_bytes() <= 227 * 1024
    # the accumulators leave the registers times 2^28 (both operands were decoded times 2^-14)
    assert len(re.findall(r"mul\.rn\.f32 t, %r\d+, 0f4D800000;", ptx)) == 4 * cfg.nt * 4


def consumer_loop_census(ptx: str) -> dict[str, int]:
    """PTX instructions of the consumer's main loop (one k-tile of one consumer warp), by opcode:
    the loop around the mma.sync instructions, inline-asm bodies included."""
    lines = ptx.splitlines()
    mmas = [i for i, line in enumerate(lines) if "mma.sync" in line]
    body = None
    for i in range(mmas[0], -1, -1):
        m = re.match(r"^(\$L__BB\d+_\d+):", lines[i].strip())
        if m:
            back = [j for j in range(mmas[-1], len(lines))
                    if re.search(r"bra(\.uni)?\s+" + re.escape(m.group(1)) + ";", lines[j])]
            if back:
                body = lines[i:back[0] + 1]
                break
    assert body is not None, "no consumer loop"
    counts: dict[str, int] = {}
    for line in body:
        t = line.strip()
        if not t or t.startswith(("//", ".reg", ".pragma", "{", "}", "$L", "DSV4")) or t.endswith(":"):
            continue
        op = re.sub(r"^@!?%?\w+\s+", "", t).split()[0].rstrip(";")
        counts[op] = counts.get(op, 0) + 1
    return counts


# consumer-loop PTX instructions per k-tile before the rebias decode (commit 0c4c3a4), for the report
CENSUS_BEFORE = {"n8_bk256": 1447, "n16_bk256": 1663}


@needs_cutlass
@pytest.mark.parametrize("name", ["n8_bk256", "n16_bk256"])
def test_decode_gemm_consumer_census(builds, name, capsys):
    """Instructions of the consumer loop per k-tile: 15 per decoded 8 codes (11 integer + 4 f16x2
    multiplies; the table decode took 17) plus the MMAs, loads, scale conversions (10 per row: the
    broadcast half moves vanish into HMUL2 operand selects in SASS) and a few loop instructions."""
    cfg, ptx = builds[name]
    c = consumer_loop_census(ptx)
    total = sum(c.values())
    words = (8 + cfg.nt) * 4 * cfg.qpt  # decoded 32-bit words per lane and k-tile
    assert c["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"] == 4 * cfg.nt * 2 * 4 * cfg.qpt
    assert c["mul.rn.f16x2"] == 4 * words
    assert c.get("prmt.b32", 0) <= 4 * (8 + cfg.nt)  # only the scale broadcasts
    overhead = total - 15 * words - c["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]
    assert overhead <= 11 * (8 + cfg.nt) + 40, (overhead, c)
    per_elem = total * 32 / (64 * cfg.bk)  # thread-instructions per weight element
    with capsys.disabled():
        print(f"\n[{name}] consumer loop: {total} PTX instructions per k-tile and warp "
              f"(before: {CENSUS_BEFORE[name]}), {per_elem:.2f} per weight element; "
              + ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])))


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
    # copy16 (coalesced 16-byte row chunks) and the split-K sum's batched loads are the defaults of both
    # forms, measured faster on an H100 with the same bits; each can be turned off for the profile
    dense = decode_plan(1, 4096, 7168, swiglu=False, num_sms=132)
    assert p.cfg.copy16 and p.cfg.reduce_ilp and dense.cfg.copy16 and dense.cfg.reduce_ilp
    off = decode_plan(1, 4096, 7168, swiglu=False, num_sms=132, copy16=False, reduce_ilp=False)
    assert not off.cfg.copy16 and not off.cfg.reduce_ilp
    assert decode_plan(40 * 16, 512, 1024, swiglu=False, num_sms=132, num_experts=16).cfg.ntok == 16


# ----------------------------------------------------------------------------- the decode's PTX, interpreted
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


# ----------------------------------------------------------------------------- exhaustive, vectorized
@needs_cutlass
def test_rebias_decode_is_exhaustively_bit_exact():
    """DECODE8_REBIAS, interpreted, for every byte value at every byte position x every finite E4M3
    block scale (254 bytes: the two NaNs excluded): each f16 half is exactly e2m1 x scale x 2^-14
    (the emulated decode, sign of zero included) and bit for bit the former decode's half
    (DECODE8_PAIRS) times 2^-14, in the permuted order REBIAS_ORDER. (Negative scale bytes are
    included although block scales are never negative.)"""
    import numpy as np
    import torch

    from dsv4.kernels.cutedsl.sm90 import decode_ptx
    from dsv4.numerics import e2m1_decode, e4m3_decode

    j = np.arange(256, dtype=np.uint32)
    words = j | ((j + 64) % 256) << 8 | ((j + 128) % 256) << 16 | ((j + 192) % 256) << 24  # each byte everywhere
    sbytes = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
    scale = e4m3_decode(torch.from_numpy(sbytes).view(torch.float8_e4m3fn)).double().numpy()
    s16 = scale.astype(np.float16)
    assert (s16.astype(np.float64) == scale).all()  # cvt.rn.f16x2.e4m3x2 is exact
    sbits = s16.view(np.uint16).astype(np.uint32)
    sword = (sbits | sbits << 16)[:, None]  # broadcast f16x2 scale, [scales, 1]
    x = words[None, :]  # [1, words]
    new = _run_ptx_np(decode_ptx.DECODE8_REBIAS, [x, sword], 4)
    old = _run_ptx_np(decode_ptx.DECODE8_PAIRS, [x, sword], 4)
    halves_new = np.stack([(w >> (16 * h)) & 0xFFFF for w in new for h in (0, 1)]).astype(np.uint16).view(np.float16)
    halves_old = np.stack([(w >> (16 * h)) & 0xFFFF for w in old for h in (0, 1)]).astype(np.uint16).view(np.float16)
    codes = torch.from_numpy(((x[None] >> (4 * np.arange(8, dtype=np.uint32))[:, None, None]) & 0xF).astype(np.uint8))
    e2m1 = e2m1_decode(codes).double().numpy()  # [nibble, 1, words]
    for i, nib in enumerate(decode_ptx.REBIAS_ORDER):
        got = halves_new[i]
        want = e2m1[nib] * scale[:, None] * 2.0 ** -14
        assert (got.astype(np.float64) == want).all(), i
        neg = ((x >> (4 * nib + 3)) & 1).astype(bool) ^ np.signbit(s16)[:, None]
        assert (np.signbit(got) == neg).all(), i  # sign of zero too: code sign xor scale sign
        ref = (halves_old[nib].astype(np.float64) * 2.0 ** -14).astype(np.float16)  # old order: nibble i
        assert (got.view(np.uint16) == ref.view(np.uint16)).all(), i
    assert len(sbytes) * len(words) == 65024
