"""Flash and Pro: the expected tensor names and stored shapes of a few layers against spec §2.2
(enumerated from the config; nothing is allocated)."""
from __future__ import annotations

import pytest

from dsv4.checkpoint.formats import stored_shapes
from dsv4.checkpoint.names import global_weights, layer_weights, mtp_weights
from dsv4.config import preset

# (layer, canonical name, format kind of the official checkpoint) -> {role: shape} for Flash | Pro.
SPEC_22 = {
    (2, "attn.wq_a", "fp8_block"): ({"weight": (1024, 4096), "scale": (8, 32)},
                                    {"weight": (1536, 7168), "scale": (12, 56)}),
    (2, "attn.wq_b", "fp8_block"): ({"weight": (32768, 1024), "scale": (256, 8)},
                                    {"weight": (65536, 1536), "scale": (512, 12)}),
    (2, "attn.wkv", "fp8_block"): ({"weight": (512, 4096), "scale": (4, 32)},
                                   {"weight": (512, 7168), "scale": (4, 56)}),
    (2, "attn.wo_a", "fp8_block"): ({"weight": (8192, 4096), "scale": (64, 32)},
                                    {"weight": (16384, 4096), "scale": (128, 32)}),
    (2, "attn.wo_b", "fp8_block"): ({"weight": (4096, 8192), "scale": (32, 64)},
                                    {"weight": (7168, 16384), "scale": (56, 128)}),
    (2, "attn.attn_sink", "param"): ({"weight": (64,)}, {"weight": (128,)}),
    (2, "attn.compressor.wkv", "dense"): ({"weight": (1024, 4096)}, {"weight": (1024, 7168)}),
    (2, "attn.compressor.ape", "param"): ({"weight": (4, 1024)}, {"weight": (4, 1024)}),
    (3, "attn.compressor.wgate", "dense"): ({"weight": (512, 4096)}, {"weight": (512, 7168)}),
    (3, "attn.compressor.ape", "param"): ({"weight": (128, 512)}, {"weight": (128, 512)}),
    (2, "attn.indexer.wq_b", "fp8_block"): ({"weight": (8192, 1024), "scale": (64, 8)},
                                            {"weight": (8192, 1536), "scale": (64, 12)}),
    (2, "attn.indexer.weights_proj", "dense"): ({"weight": (64, 4096)}, {"weight": (64, 7168)}),
    (2, "attn.indexer.compressor.wkv", "dense"): ({"weight": (256, 4096)}, {"weight": (256, 7168)}),
    (2, "attn.indexer.compressor.ape", "param"): ({"weight": (4, 256)}, {"weight": (4, 256)}),
    (2, "attn.indexer.compressor.norm", "dense"): ({"weight": (128,)}, {"weight": (128,)}),
    (4, "hc_attn_fn", "param"): ({"weight": (24, 16384)}, {"weight": (24, 28672)}),
    (4, "hc_ffn_scale", "param"): ({"weight": (3,)}, {"weight": (3,)}),
    (4, "ffn.gate", "dense"): ({"weight": (256, 4096)}, {"weight": (384, 7168)}),
    (4, "ffn.gate.bias", "param"): ({"weight": (256,)}, {"weight": (384,)}),
    (0, "ffn.gate.tid2eid", "index"): ({"weight": (129280, 6)}, {"weight": (129280, 6)}),
    (4, "ffn.experts.7.w1", "mxfp4"): ({"weight": (2048, 2048), "scale": (2048, 128)},
                                       {"weight": (3072, 3584), "scale": (3072, 224)}),
    (4, "ffn.experts.7.w2", "mxfp4"): ({"weight": (4096, 1024), "scale": (4096, 64)},
                                       {"weight": (7168, 1536), "scale": (7168, 96)}),
    (4, "ffn.shared_experts.w3", "fp8_block"): ({"weight": (2048, 4096), "scale": (16, 32)},
                                                {"weight": (3072, 7168), "scale": (24, 56)}),
    (4, "ffn.shared_experts.w2", "fp8_block"): ({"weight": (4096, 2048), "scale": (32, 16)},
                                                {"weight": (7168, 3072), "scale": (56, 24)}),
}


@pytest.mark.parametrize("which", [0, 1], ids=["flash", "pro"])
def test_layer_tensors_match_spec(which):
    c = preset(["flash", "pro"][which])
    specs = {(i, s.name): s for i in (0, 2, 3, 4) for s in layer_weights(c, i)}
    for (layer, name, kind), shapes in SPEC_22.items():
        assert stored_shapes(kind, specs[(layer, name)].shape) == shapes[which], (layer, name)


def test_layer_schedules_decide_compressor_indexer_and_hash_tensors():
    flash, pro = preset("flash"), preset("pro")
    names = lambda c, i: {s.name for s in layer_weights(c, i)}   # noqa: E731
    assert "attn.compressor.wkv" not in names(flash, 0)            # Flash 0-1: window only
    assert "attn.indexer.wq_b" in names(flash, 2) and "attn.indexer.wq_b" not in names(flash, 3)
    assert "attn.compressor.wkv" in names(pro, 0) and "attn.indexer.wq_b" not in names(pro, 0)   # Pro 0: HCA
    assert "ffn.gate.tid2eid" in names(flash, 2) and "ffn.gate.bias" not in names(flash, 2)
    assert "ffn.gate.bias" in names(flash, 3) and "ffn.gate.tid2eid" not in names(flash, 3)
    assert sum(1 for s in layer_weights(flash, 5) if s.is_expert) == 3 * 256


def test_global_and_mtp_tensors():
    for c, d in ((preset("flash"), 4096), (preset("pro"), 7168)):
        g = {s.name: s.shape for s in global_weights(c)}
        assert g["embed"] == g["head"] == (129280, d) and g["hc_head_fn"] == (4, 4 * d)
        assert g["hc_head_scale"] == (1,)
        m = {s.full_name: s for s in mtp_weights(c)}
        assert stored_shapes("fp8_block", m["mtp.0.e_proj"].shape) == {"weight": (d, d),
                                                                       "scale": (d // 128, d // 128)}
        assert "mtp.0.attn.compressor.wkv" not in m and "mtp.0.ffn.gate.bias" in m   # ratio 0, non-hash
