"""The per-call audit's replay of one routed-expert GEMM at DeepSeek-V4 Pro width, and the FP4 decode
inside it, as ratios measured side by side in one run.

    python benchmarks/bench_audit_replay.py [--tokens 1024] [--repeat 3] [--json PATH]

A Pro routed bank (384 experts x 6144 x 7168, the w13 of one layer) is too big to decode whole, so the
audit decodes, per call, every expert the call routes rows to; at 1,024 tokens x top-6 that is nearly
all of them. Times (minimum over ``--repeat``):

* the decode of one expert's weights: ``nvfp4_dequantize`` (one gather from a byte -> value-pair
  table) against the nibble-by-nibble form it replaced (codes, 64-bit indices, values, then scales);
* ``audit_grouped`` on a kernel's output, with each decode form (the other parts are the same code);
* the unscaled value gather alone by three equivalent forms (checked bit-identical), for the next step.
Needs a CUDA GPU and the sm_90a kernels (the call to judge comes from ``cutedsl_sm90``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def nibble_decode(packed, scales, g):
    """The decode before the pair table (dsv4.numerics at 279f1f2), for the side-by-side ratio."""
    import torch

    from dsv4.numerics.e2m1 import decode_codes_unchecked, unpack_nibbles
    from dsv4.numerics.e4m3 import e4m3_decode

    lead, k = tuple(packed.shape[:-1]), 2 * int(packed.shape[-1])
    vals = decode_codes_unchecked(unpack_nibbles(packed)).reshape(*lead, k // 16, 16)
    gt = g if torch.is_tensor(g) else torch.full((), float(g), device=packed.device)
    return ((vals * e4m3_decode(scales).unsqueeze(-1)) * gt).reshape(*lead, k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_audit_replay: needs a CUDA GPU; none is present", file=sys.stderr)
        return 2
    from dsv4.kernels.contract import ActQuantRequest, FP4Operand, GroupedGemmRequest
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend
    from dsv4.numerics import nvfp4_dequantize, swizzled_numel, unswizzle_scales
    from parity.audit import calls

    def best(fn):
        out = float("inf")
        for _ in range(args.repeat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out = min(out, time.perf_counter() - t0)
        return out

    E, n, k, top = 384, 6144, 7168, 6
    gen = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randint(0, 256, (E * n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    scales = torch.randint(0x30, 0x40, (E * swizzled_numel(n, k // 16),), dtype=torch.uint8, device="cuda",
                           generator=gen).view(torch.float8_e4m3fn)
    w_g = torch.full((E,), 0.01, device="cuda")
    b = FP4Operand(packed, scales, w_g, k=k, scale_layout="swizzled")
    rows = args.tokens * top
    counts = torch.bincount(torch.randint(0, E, (rows,), device="cuda", generator=gen), minlength=E)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), counts.cumsum(0)]).to(torch.int32)
    g = torch.tensor(0.02, device="cuda")
    be = Sm90Backend("cuda")
    a = be.quantize_activation(ActQuantRequest(torch.randn(rows, k, device="cuda", dtype=torch.bfloat16),
                                               global_scale=g, scale_layout="swizzled"))
    req = GroupedGemmRequest(a, b, offsets, (g * w_g).float())
    got = be.grouped_gemm(req)
    one_p, one_s = packed[:n], unswizzle_scales(scales[:swizzled_numel(n, k // 16)], n, k // 16)
    elements = n * k
    t_pair = best(lambda: nvfp4_dequantize(one_p, one_s, 1.0))
    t_nib = best(lambda: nibble_decode(one_p, one_s, 1.0))
    assert torch.equal(nvfp4_dequantize(one_p, one_s, 1.0), nibble_decode(one_p, one_s, 1.0))

    # the same values by other gathers, for the next change of the decode (each checked bit-identical)
    from dsv4.numerics.nvfp4 import _pair_table, decode_packed_pairs

    table = _pair_table().to("cuda")
    lut64 = table.contiguous().view(torch.int64).reshape(256)
    variants = {
        "index_select_pairs": lambda: decode_packed_pairs(one_p),
        "int64_pair_gather": lambda: lut64[one_p.to(torch.int32)].view(torch.float32),
        "embedding_pairs": lambda: torch.nn.functional.embedding(one_p.to(torch.int32), table).reshape(n, k),
    }
    want = decode_packed_pairs(one_p).view(torch.int32)
    variant_s = {}
    for name, fn in variants.items():
        assert torch.equal(fn().reshape(n, k).view(torch.int32), want), name
        variant_s[name] = best(fn)
    checks = {}
    t_audit_pair = best(lambda: checks.__setitem__("pair", calls.audit_grouped(req, got)))
    saved = calls.nvfp4_dequantize, calls._Bank.take
    try:   # the replay as it was: nibble decode, each expert decoded alone and stacked
        calls.nvfp4_dequantize = nibble_decode

        def take_stacked(self, ids):
            w = torch.stack([nibble_decode(self.op.packed[e * n:(e + 1) * n], calls.group_scales(self.op, e, n), 1.0)
                             for e in ids])
            return w, w.abs()

        calls._Bank.take = take_stacked
        t_audit_nib = best(lambda: checks.__setitem__("nibble", calls.audit_grouped(req, got)))
    finally:
        calls.nvfp4_dequantize, calls._Bank.take = saved
    same = {key: (c.violations, c.elements, c.worst_ratio) for key, c in checks.items()}
    result = {
        "bench": "audit_replay", "card": torch.cuda.get_device_name(), "tokens": args.tokens,
        "shape": {"experts": E, "n": n, "k": k, "top_k": top, "rows": rows,
                  "experts_touched": int((counts > 0).sum())},
        "decode_one_expert_s": {"pair_table": t_pair, "nibble": t_nib, "ratio_nibble_to_pair": t_nib / t_pair},
        "decode_one_expert_gb_per_s_written": {"pair_table": elements * 4 / t_pair / 1e9,
                                               "nibble": elements * 4 / t_nib / 1e9},
        "unscaled_decode_variants_s": variant_s,
        "audit_grouped_s": {"pair_table": t_audit_pair, "nibble": t_audit_nib,
                            "ratio_nibble_to_pair": t_audit_nib / t_audit_pair},
        "judgements": same, "judgements_equal": len(set(same.values())) == 1,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if result["judgements_equal"] and same["pair"][0] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
