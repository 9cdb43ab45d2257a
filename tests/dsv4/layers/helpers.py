"""Small builders shared by the layer tests (plain functions, no fixtures with state)."""
from __future__ import annotations

import torch

from dsv4.checkpoint.formats import DENSE, WeightFormat, StoredWeight
from dsv4.kernels.registry import get_backend
from dsv4.layers.dispatch import Dispatcher, KernelLog
from dsv4.layers.grouped_linear import GROUPED_CLASSES, GroupedLinear
from dsv4.layers.linear import LINEAR_CLASSES, Linear
from dsv4.weights import convert_rows, stack_bank


def dense(w: torch.Tensor) -> StoredWeight:
    """An FP32 dense stored weight (the converter then produces any target format)."""
    return StoredWeight({"weight": w.to(torch.float32)}, WeightFormat(DENSE, tuple(w.shape), "F32"))


def dispatcher() -> Dispatcher:
    return Dispatcher(get_backend("emulated", "cpu"), KernelLog())


def make_linear(ws: list[torch.Tensor], fmt: str, *, name: str = "t.lin", component: str = "attn_q",
                out_dtype: torch.dtype = torch.bfloat16, disp: Dispatcher | None = None,
                act_scale: str = "static") -> Linear:
    w, _, _ = convert_rows([dense(x) for x in ws], fmt)
    extra = {"dispatcher": disp or dispatcher(), "act_scale": act_scale} if fmt == "fp4" else {}
    return LINEAR_CLASSES[fmt](name, component, w, out_dtype=out_dtype, **extra)


def make_grouped(groups: list[list[torch.Tensor]], fmt: str, *, name: str = "t.grp",
                 component: str = "routed_experts", disp: Dispatcher | None = None) -> GroupedLinear:
    bank = stack_bank([convert_rows([dense(x) for x in g], fmt)[0] for g in groups])
    extra = {"dispatcher": disp or dispatcher()} if fmt == "fp4" else {}
    return GROUPED_CLASSES[fmt](name, component, bank, len(groups), **extra)


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


# ---- a small attention layer from random weights (BF16 unless asked) -----------------------------------
D_MODEL, HEADS, HEAD_DIM, ROPE, QLORA, GROUPS, RANK, WINDOW = 128, 2, 128, 64, 128, 2, 128, 8
IDX_HEADS, IDX_DIM = 2, 128


def build_compressor(ratio: int, overlap: bool, width: int, *, seed: int = 0, fmt: str = "bf16"):
    from dsv4.config import preset
    from dsv4.layers.compressor import Compressor
    from dsv4.layers.norm import RMSNorm
    from dsv4.layers.rope import Rope, rope_omega

    k = 2 if overlap else 1
    f32 = torch.float32
    return Compressor("t.comp", make_linear([rand(k * width, D_MODEL, seed=seed + 1, scale=D_MODEL ** -0.5)], fmt,
                                            component="compressor", out_dtype=f32),
                      make_linear([rand(k * width, D_MODEL, seed=seed + 2, scale=D_MODEL ** -0.5)], fmt,
                                  component="compressor", out_dtype=f32),
                      rand(ratio, k * width, seed=seed + 3), RMSNorm(1 + 0.1 * rand(width, seed=seed + 4), 1e-6),
                      ratio=ratio, overlap=overlap, width=width,
                      rope=Rope(rope_omega(preset("tiny"), compressed=True), ROPE))


def build_attention(ratio: int, *, kv: str = "bf16", topk: int = 3, seed: int = 0, qk: str = "none"):
    """ratio 0: window only; 4: CSA (with indexer); 8: HCA."""
    from dsv4.config import preset
    from dsv4.layers.attention import Attention
    from dsv4.layers.indexer import Indexer
    from dsv4.layers.kv_cache import KV_STORAGES
    from dsv4.layers.norm import RMSNorm
    from dsv4.layers.rope import Rope, rope_omega

    rope = Rope(rope_omega(preset("tiny"), compressed=ratio > 0), ROPE)
    lin = lambda n, k, s, **kw: make_linear([rand(n, k, seed=seed + s, scale=k ** -0.5)], "bf16", **kw)
    comp = build_compressor(ratio, ratio == 4, HEAD_DIM, seed=seed + 100) if ratio else None
    indexer = None
    if ratio == 4:
        indexer = Indexer("layers.1.", lin(IDX_HEADS * IDX_DIM, QLORA, 20, component="indexer_q"),
                          lin(IDX_HEADS, D_MODEL, 21, component="indexer_weights", out_dtype=torch.float32),
                          build_compressor(4, True, IDX_DIM, seed=seed + 200), rope, n_heads=IDX_HEADS,
                          head_dim=IDX_DIM, topk=topk, ratio=4, qk_treatment=qk)
    wo_a = make_grouped([[rand(RANK, HEADS * HEAD_DIM // GROUPS, seed=seed + 30 + g, scale=0.1)]
                         for g in range(GROUPS)], "bf16", component="attn_o")
    return Attention("layers.1.", wq_a=lin(QLORA, D_MODEL, 1), q_norm=RMSNorm(torch.ones(QLORA), 1e-6),
                     wq_b=lin(HEADS * HEAD_DIM, QLORA, 2), wkv=lin(HEAD_DIM, D_MODEL, 3),
                     kv_norm=RMSNorm(torch.ones(HEAD_DIM), 1e-6), wo_a=wo_a, wo_b=lin(D_MODEL, GROUPS * RANK, 4),
                     sink=torch.tensor([0.5, 2.0]), rope=rope, kv_storage=KV_STORAGES[kv](HEAD_DIM, ROPE),
                     compressor=comp, indexer=indexer, n_heads=HEADS, head_dim=HEAD_DIM, o_groups=GROUPS,
                     window=WINDOW, ratio=ratio, eps=1e-6)


def new_cache():
    from dsv4.layers.kv_cache import LayerCache, WindowCache
    return LayerCache(WindowCache(WINDOW))
