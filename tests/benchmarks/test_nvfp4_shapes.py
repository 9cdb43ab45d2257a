"""The NVFP4 shape table (every GEMM of a Flash / Pro layer and the LM head) checked against the configs
and the published sizes, and the GPU bench's CPU surface: --help at once, exit 2 without a Hopper GPU,
its roofline bytes and target verdicts."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import nvfp4_shapes as NS  # noqa: E402

from dsv4.config import preset  # noqa: E402

VOCAB = 129280                                   # published: both releases
EXPERTS = {"flash": 256, "pro": 384}             # published routed-expert counts


def _by_name(shapes: list) -> dict:
    return {nm: s for s in shapes for nm in s.names}


def check_table(model: str, cfg, shapes: list) -> None:
    """Everything the bench relies on, against the config values (and the published facts)."""
    assert shapes, model
    c, D, I = cfg, cfg.hidden_size, cfg.moe_intermediate_size
    assert NS.misaligned(shapes) == [], [NS.describe(s) for s in NS.misaligned(shapes)]
    assert all(s.n > 0 and s.k > 0 and s.k % 32 == 0 and s.model == model for s in shapes)
    names = [nm for s in shapes for nm in s.names]
    assert len(names) == len(set(names)), names
    assert len({s.name for s in shapes}) == len(shapes)
    assert len({s.key for s in shapes}) == len(shapes)                     # deduplicated
    by = _by_name(shapes)
    need = {"head", "ffn.experts.w13", "ffn.experts.w2", "ffn.shared_experts.w13", "ffn.shared_experts.w2",
            "attn.wo_a"}
    assert need <= set(by), need - set(by)
    head = by["head"]
    assert (head.n, head.k, head.grouped, head.swiglu) == (c.vocab_size, D, None, False)
    assert head.n == VOCAB
    w13, w2 = by["ffn.experts.w13"], by["ffn.experts.w2"]
    assert w13.grouped == w2.grouped == (c.n_routed_experts, c.num_experts_per_tok)
    assert w13.grouped[0] == EXPERTS[model]
    assert (w13.n, w13.k, w13.swiglu, w13.n_out) == (2 * I, D, True, I)
    assert (w2.n, w2.k, w2.swiglu) == (D, I, False)
    assert w13.routed and w2.routed
    sh13, sh2 = by["ffn.shared_experts.w13"], by["ffn.shared_experts.w2"]
    assert (sh13.n, sh13.k, sh13.swiglu, sh13.grouped) == (2 * I, D, True, None)
    assert (sh2.n, sh2.k, sh2.grouped) == (D, I, None)
    H, d, G = c.num_attention_heads, c.head_dim, c.o_groups
    want = {"attn.wq_a": (c.q_lora_rank, D), "attn.wq_b": (H * d, c.q_lora_rank), "attn.wkv": (d, D),
            "attn.wo_b": (D, G * c.o_lora_rank), "ffn.gate": (c.n_routed_experts, D),
            "attn.compressor.wkv[csa]": (2 * d, D), "attn.compressor.wgate[csa]": (2 * d, D),
            "attn.compressor.wkv[hca]": (d, D), "attn.compressor.wgate[hca]": (d, D),
            "attn.indexer.wq_b": (c.index_n_heads * c.index_head_dim, c.q_lora_rank),
            "attn.indexer.weights_proj": (c.index_n_heads, D),
            "attn.indexer.compressor.wkv[csa]": (2 * c.index_head_dim, D),
            "attn.indexer.compressor.wgate[csa]": (2 * c.index_head_dim, D)}
    for nm, (n, k) in want.items():
        assert nm in by, nm
        assert (by[nm].n, by[nm].k, by[nm].grouped, by[nm].swiglu) == (n, k, None, False), nm
    wo_a = by["attn.wo_a"]
    assert (wo_a.n, wo_a.k, wo_a.grouped) == (c.o_lora_rank, c.wo_a_group_in, (G, None)) and not wo_a.routed
    assert set(names) == set(want) | need


@pytest.mark.parametrize("model", NS.MODELS)
def test_table_matches_the_config_and_the_published_sizes(model):
    cfg = NS.model_config(model)
    real = preset(model)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size, cfg.hidden_size) == \
           (real.n_routed_experts, real.num_experts_per_tok, real.vocab_size, real.hidden_size)
    shapes = NS.gemm_shapes(cfg, model)
    check_table(model, cfg, shapes)
    # the bench config's few layers cover every layer kind: the full model has the same GEMMs
    assert {s.key: set(s.names) for s in NS.gemm_shapes(real, model)} == {s.key: set(s.names) for s in shapes}
    fmt = {nm: f for s in shapes for nm, f in zip(s.names, s.formats)}
    assert fmt["ffn.experts.w13"] == "fp4" and fmt["head"] == "bf16"   # the default plan, as recorded


@pytest.mark.parametrize("model", NS.MODELS)
def test_the_check_fails_on_a_wrong_table(model):
    cfg = NS.model_config(model)
    shapes = NS.gemm_shapes(cfg, model)

    def tampered(name, **change):
        return [dataclasses.replace(s, **change) if name in s.names else s for s in shapes]

    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    for bad in (tampered("ffn.experts.w13", grouped=(e - 1, k)), tampered("ffn.experts.w2", grouped=(e, k + 1)),
                tampered("head", n=cfg.vocab_size - 1), tampered("ffn.shared_experts.w13", swiglu=False),
                tampered("attn.wq_b", k=cfg.q_lora_rank + 16), [s for s in shapes if "attn.wo_a" not in s.names]):
        with pytest.raises(AssertionError):
            check_table(model, cfg, bad)
    # a config with the wrong expert count gives a table that fails the published count
    wrong = cfg.replace(n_routed_experts=EXPERTS[model] // 2)
    with pytest.raises(AssertionError):
        check_table(model, wrong, NS.gemm_shapes(wrong, model))


def test_misaligned_flags_a_bad_k():
    s = NS.Shape("flash", "x", ("x",), 128, 100)
    assert NS.misaligned([s, dataclasses.replace(s, k=128)]) == [s]


# ---- the bench's CPU surface ----------------------------------------------------------------------
def _bench():
    spec = importlib.util.spec_from_file_location("bench_nvfp4_shapes", BENCH / "bench_nvfp4_shapes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_answers_at_once_without_torch():
    t0 = time.time()
    r = subprocess.run([sys.executable, str(BENCH / "bench_nvfp4_shapes.py"), "--help"], capture_output=True,
                       text=True, timeout=20)
    assert r.returncode == 0 and "usage:" in r.stdout and "--budget-s" in r.stdout, r.stderr[-1000:]
    assert time.time() - t0 < 20
    probe = ("import runpy, sys; sys.argv=['b', '--help']\ntry:\n runpy.run_path(%r, run_name='__main__')\n"
             "except SystemExit: pass\nprint('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'cutlass')))") % str(BENCH / "bench_nvfp4_shapes.py")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=20)
    assert "HEAVY []" in r.stdout, r.stdout[-500:] + r.stderr[-1000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without CUDA")
def test_without_a_hopper_or_blackwell_gpu_main_returns_2(capsys, tmp_path):
    b = _bench()
    assert b.main(["--models", "flash", "--ms", "1,4", "--json", str(tmp_path / "x.json")]) == 2
    assert "needs an sm_90 (Hopper) or sm_100 (Blackwell) GPU" in capsys.readouterr().out
    assert not (tmp_path / "x.json").exists()


def test_arguments_are_checked():
    b = _bench()
    a = b.parse_args(["--models", "pro", "--ms", "16,1,4"])
    assert a.model_list == ("pro",) and a.m_list == [1, 4, 16] and a.budget_s == 500.0
    assert b.parse_args([]).m_list == [1, 4, 16, 64, 512, 4096]
    for bad in (["--models", "flash,ultra"], ["--ms", "1,x"], ["--ms", "0"]):
        with pytest.raises(SystemExit):
            b.parse_args(bad)


def test_roofline_bytes_and_targets():
    b = _bench()
    by = _by_name(NS.gemm_shapes(NS.model_config("pro"), "pro"))
    w13, head = by["ffn.experts.w13"], by["head"]
    fp4 = lambda r, k: r * k // 2 + r * k // 16   # noqa: E731
    # grouped: only the active experts' weights; the SwiGLU output is n/2 wide
    assert b.io_bytes(w13, 6, 6) == 6 * fp4(6144, 7168) + fp4(6, 7168) + 2 * 6 * 3072
    assert b.io_bytes(head, 1, 1) == fp4(129280, 7168) + fp4(1, 7168) + 2 * 129280
    assert b.targets(1, False, 2.6, 0.71) == {">=2.5x bf16": True, ">=70% roofline": True}
    assert b.targets(16, False, 2.4, 0.9) == {">=2.5x bf16": False, ">=70% roofline": True}
    assert b.targets(4096, False, 0.81, 0.1) == {">=0.8x bf16": True}
    assert b.targets(512, False, 0.1, 0.1) == {}
    assert b.targets(4, True, 2.9, 0.8) == {">=3x bf16 grouped": False, ">=70% roofline": True}
    assert b.targets(4096, True, 3.1, 0.01) == {">=3x bf16 grouped": True}
    assert b.targets(1, False, math.nan, math.nan) == {">=2.5x bf16": False, ">=70% roofline": False}
    row = {"m": 1, "routed": False, "io_bytes": 4_000_000, "fp4_graph_us": 2.0, "fp4_eager_us": 8.0,
           "bf16_graph_us": 6.0, "bf16_eager_us": 10.0, "dec_graph_us": math.nan, "errors": []}
    b.finish(row, 4e12)
    assert row["roofline_us"] == pytest.approx(1.0) and row["fp4_roof"] == pytest.approx(0.5)
    assert row["fp4_x_bf16"] == pytest.approx(3.0) and row["fp4_x_bf16_eager"] == pytest.approx(1.25)
    assert row["fp4_met"] is False and row["dec_met"] is False     # 50 % of roofline; a failed decode time


def test_route_of_names_the_kernel_each_arch_picks():
    """The bench's ``fp4_route`` per arch, from the backends' own rules (sm_100: no prefill route, no
    grouped decode kernel)."""
    sys.path.insert(0, str(BENCH))
    from nvfp4_arch_kernels import route_of

    assert route_of("sm_90", 4, 3072, 7168) == route_of("sm_100", 4, 3072, 7168) == "decode"
    assert route_of("sm_90", 4, 1536, 7168) == route_of("sm_100", 4, 1536, 7168) == "generic"
    assert route_of("sm_90", 4096, 3072, 7168) == "prefill" and route_of("sm_100", 4096, 3072, 7168) == "generic"
    assert route_of("sm_90", 6, 6144, 7168, experts=384) == "decode"
    assert route_of("sm_100", 6, 6144, 7168, experts=384) == "generic"
    with pytest.raises(ValueError, match="expected an arch"):
        route_of("sm_80", 1, 2048, 256)

