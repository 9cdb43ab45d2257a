"""The whole tiny model: probes and their shapes, causality, determinism, decode == longer prefill,
the layer-by-layer surface, batching, streaming reads, profiles and bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reference
from dsv4 import probes
from dsv4.checkpoint.synth import resolve_preset
from reference.fakequant import fake_quant_fp8


def expected_shapes(c, T: int, new_entries: dict[int, int], entries: dict[int, int]) -> dict[str, tuple]:
    D, H, d, n = c.hidden_size, c.num_attention_heads, c.head_dim, c.hc_mult
    k = c.num_experts_per_tok
    out = {"embed": (T, D), "hc_head": (T, D), "final_norm": (T, D), "logits": (T, c.vocab_size)}
    for i in range(c.num_hidden_layers):
        p, kind = f"layers.{i}.", c.layer_kind(i)
        out.update({p + "hc.attn.pre": (T, D), p + "attn.q": (T, H, d), p + "attn.kv": (T, d),
                    p + "attn.core": (T, H, d), p + "attn.out": (T, D), p + "hc.attn.post": (T, n, D),
                    p + "hc.ffn.pre": (T, D), p + "ffn.router.logits": (T, c.n_routed_experts),
                    p + "ffn.router.topk_ids": (T, k), p + "ffn.router.weights": (T, k),
                    p + "ffn.routed.out": (T, D), p + "ffn.shared.out": (T, D), p + "ffn.out": (T, D),
                    p + "out": (T, n, D)})
        if kind != "window":
            out[p + "attn.compressed_kv"] = (new_entries[i], d)
        if kind == "csa":
            N = entries[i]
            out.update({p + "attn.indexer.q": (T, c.index_n_heads, c.index_head_dim),
                        p + "attn.indexer.k": (new_entries[i], c.index_head_dim),
                        p + "attn.indexer.scores": (T, N), p + "attn.indexer.topk": (T, min(c.index_topk, N))})
    return out


def check_probes(rec, c, T: int, new_entries: dict[int, int], entries: dict[int, int]) -> None:
    want = expected_shapes(c, T, new_entries, entries)
    kinds = [c.layer_kind(i) for i in range(c.num_hidden_layers)]
    assert rec.order == probes.probe_names(c.num_hidden_layers, kinds)     # every name, execution order
    for name in rec.order:
        assert tuple(rec[name].shape) == want[name], name
    for name in rec.order:
        if name.endswith(("scores", "router.logits", "router.weights")) or name == "logits":
            assert rec[name].dtype == torch.float32, name
        if name.endswith(("topk", "topk_ids")):
            assert rec[name].dtype == torch.int64, name


@pytest.mark.parametrize("T", [37, 3])
def test_prefill_emits_every_probe_with_its_shape(tiny_model, make_ids, T: int) -> None:
    m, c = tiny_model(dtype=torch.bfloat16), tiny_model().config
    with probes.ProbeRecorder() as rec:
        m(make_ids(T))
    ent = {i: T // c.compress_ratio(i) for i in range(c.num_hidden_layers) if c.compress_ratio(i)}
    check_probes(rec, c, T, ent, ent)
    if T == 37:   # masked scores: −inf exactly where j >= ⌊(t+1)/4⌋; topk ascending, −1 last
        s, topk = rec["layers.1.attn.indexer.scores"], rec["layers.1.attn.indexer.topk"]
        vis = (torch.arange(T) + 1) // 4
        assert torch.equal(torch.isinf(s), torch.arange(9) >= vis.unsqueeze(1))
        assert topk[0].tolist() == [-1] * 4 and topk[7].tolist() == [0, 1, -1, -1]
        assert bool((topk[20:].diff(dim=-1) > 0).all())


def test_decode_step_emits_every_probe(tiny_model, make_ids) -> None:
    m, c = tiny_model(), tiny_model().config
    ids = make_ids(17)
    _, state = m.prefill(ids[:15])
    for pos in (15, 16):       # position 15 closes an HCA block (m=16) and a CSA block; 16 closes none
        with probes.ProbeRecorder() as rec:
            m.decode_step(state, int(ids[pos]))
        new = {i: int((pos + 1) % c.compress_ratio(i) == 0) for i in range(4) if c.compress_ratio(i)}
        total = {i: (pos + 1) // c.compress_ratio(i) for i in range(4) if c.compress_ratio(i)}
        check_probes(rec, c, 1, new, total)


@pytest.mark.parametrize("profile", ["bf16", "official"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causality(tiny_model, make_ids, profile: str, dtype: torch.dtype) -> None:
    """Logits at t do not depend on tokens after t: bitwise, since masked keys add exact zeros and
    every sum is batch-invariant (reference/ops.py)."""
    a, b = make_ids(60, seed=1), make_ids(60, seed=1).clone()
    b[31:] = make_ids(29, seed=9)
    m = tiny_model(profile=profile, dtype=dtype)
    la, lb = m(a), m(b)
    assert torch.equal(la[:31], lb[:31])
    assert (la[31:] - lb[31:]).abs().max() > 0.1 * la.abs().max()


def test_deterministic_across_loads(tiny_path, make_ids) -> None:
    ids = make_ids(50, seed=4)
    runs = [reference.load_model(str(tiny_path), profile=p)(ids) for p in ("official", "official", "bf16")]
    assert torch.equal(runs[0], runs[1])
    assert runs[0].dtype == torch.float32 and bool(torch.isfinite(runs[0]).all())
    cos = F.cosine_similarity(runs[0], runs[2], dim=-1)
    # fake quantization is active; it is small, except where it flips an expert or indexer choice
    assert not torch.equal(runs[0], runs[2]) and cos.median() > 0.98


def decode_all(m, ids: torch.Tensor, n_prefill: int) -> torch.Tensor:
    logits, state = m.prefill(ids[:n_prefill])
    steps = [m.decode_step(state, int(t)) for t in ids[n_prefill:]]
    assert state.pos == ids.shape[0]
    return torch.cat([logits, torch.stack(steps)])


@pytest.mark.parametrize("profile", ["bf16", "official"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_equals_longer_prefill(tiny_model, make_ids, profile: str, dtype: torch.dtype) -> None:
    """Prefill 21 tokens, decode 43 one by one (the window ring wraps, HCA closes 4 blocks, CSA 11,
    the indexer's entries grow past index_topk) == one prefill of 64, bitwise. Both paths run the
    same code on different chunk shapes; sums accumulate in fp64 and transcendentals are evaluated
    in fp64, each rounded once (reference/ops.py), so no result depends on the chunk shape and no
    FP8/FP4 rounding boundary is crossed differently. (With plain fp32 kernels the official profile
    drifted by up to 37% of the logit scale on some prompts.)"""
    m, ids = tiny_model(profile=profile, dtype=dtype), make_ids(64, seed=3)
    with probes.ProbeRecorder(include=r"topk|compressed_kv") as full_rec:
        full = m(ids)
    with probes.ProbeRecorder(include=r"topk|compressed_kv", keep="all") as dec_rec:
        dec = decode_all(m, ids, 21)
    assert torch.equal(dec, full)
    for name in full_rec.order:
        assert torch.equal(torch.cat(dec_rec[name]), full_rec[name]), name


def test_prefill_equals_the_layer_by_layer_surface(tiny_model, make_ids) -> None:
    m, ids = tiny_model(dtype=torch.bfloat16), make_ids(33)
    state = m.new_state(ids)
    x = m.embed(ids)
    assert x.shape == (33, 4, 256) and x.dtype == torch.bfloat16
    for i in range(m.config.num_hidden_layers):
        x = m.layer(i, x.float() if i == 2 else x, state)   # any float dtype is accepted
    assert torch.equal(m.head(x), m.prefill(ids)[0])
    with pytest.raises(RuntimeError, match="cache"):
        m.layer(0, m.embed(ids), state)                      # layer 0's cache already holds these tokens


def test_batch_is_a_loop(tiny_model, make_ids) -> None:
    m = tiny_model(dtype=torch.bfloat16)
    ids = torch.stack([make_ids(20, seed=1), make_ids(20, seed=2)])
    out = m(ids)
    assert out.shape == (2, 20, 512)
    assert torch.equal(out[1], m(ids[1]))


def test_streaming_reads_each_layer_and_only_selected_experts(tiny_path, make_ids, monkeypatch) -> None:
    m = reference.load_model(str(tiny_path), cache_weights=False)
    assert m.describe()["cache_weights"] is False
    reads: list[tuple[str, int | None]] = []
    closes: list[int] = []
    weight, close = m.reader.weight, m.reader.close
    monkeypatch.setattr(m.reader, "weight", lambda name, layer=None: reads.append((name, layer)) or weight(name, layer))
    monkeypatch.setattr(m.reader, "close", lambda: closes.append(1) or close())
    with probes.ProbeRecorder(include="topk_ids") as rec:
        m(make_ids(6, seed=8))
    for i in range(m.config.num_hidden_layers):
        read = {int(n.split(".")[2]) for n, layer in reads if layer == i and n.startswith("ffn.experts.")}
        assert read == set(rec[f"layers.{i}.ffn.router.topk_ids"].unique().tolist()), i
        assert all(sum(1 for r in reads if r == (n, i)) == 1 for n, layer in reads if layer == i)
    assert len(closes) == m.config.num_hidden_layers + 2     # embed, every layer, head release their maps
    assert not m.store._memo                                 # nothing dequantized is kept


def test_fp8_points_of_the_official_profile(tiny_model, make_ids) -> None:
    """Official profile: the compressed kv nope dims are on the FP8 block-64 grid (idempotent)."""
    with probes.ProbeRecorder(include="compressed_kv") as rec:
        tiny_model(profile="official", dtype=torch.bfloat16)(make_ids(40))
    nope = rec["layers.1.attn.compressed_kv"][:, :64]
    assert torch.equal(fake_quant_fp8(nope, 64), nope)
    with probes.ProbeRecorder(include="compressed_kv") as rec:
        tiny_model(dtype=torch.bfloat16)(make_ids(40))
    assert not torch.equal(fake_quant_fp8(rec["layers.1.attn.compressed_kv"][:, :64], 64),
                           rec["layers.1.attn.compressed_kv"][:, :64])


def test_describe_and_device_map(tiny_path, tiny_model, make_ids) -> None:
    m = reference.load_model(str(tiny_path), device_map={0: "cpu", "head": "cpu"}, profile="official")
    d = m.describe()
    assert d["side"] == "reference" and d["profile"] == "official" and d["dtype"] == "bfloat16"
    assert d["devices"]["0"] == "cpu" and d["devices"]["head"] == "cpu" and len(m.fingerprint) == 64
    assert m.fingerprint == tiny_model().fingerprint
    assert d["cache_weights"] is True          # auto: a checkpoint of <= 256 MiB is cached
    ids = make_ids(12)
    assert torch.equal(m(ids), tiny_model(profile="official", dtype=torch.bfloat16)(ids))


def test_official_flavor_with_mxfp4_experts(make_ids, tiny_model) -> None:
    """The same synthetic weights with MXFP4 instead of NVFP4 experts (the official flavor) give a
    close model: only the expert rounding differs (coarser power-of-two scales per 32)."""
    m = reference.load_model(str(resolve_preset("tiny", flavor="official")), dtype=torch.float32)
    ids = make_ids(30)
    cos = F.cosine_similarity(m(ids), tiny_model()(ids), dim=-1)
    assert m.reader.flavor == "official" and cos.median() > 0.9


def test_bad_input_fails_before_compute(tiny_path, tiny_model) -> None:
    m = tiny_model()
    with pytest.raises(ValueError, match="ids in"):
        m(torch.tensor([1, 512]))
    with pytest.raises(ValueError, match="ids in"):
        m(torch.tensor([-1, 5]))
    with pytest.raises(ValueError, match="empty"):
        m(torch.zeros(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        m(torch.zeros(1025, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        m(torch.zeros(3))
    _, state = m.prefill(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="token_id"):
        m.decode_step(state, 512)
    with pytest.raises(ValueError, match="device"):
        reference.load_model(str(tiny_path), device_map={1: "cuda:7"})
    with pytest.raises(ValueError, match="device"):
        reference.load_model(str(tiny_path), device="cuda:7")
    with pytest.raises(ValueError, match="device_map key"):
        reference.load_model(str(tiny_path), device_map={9: "cpu"})
    with pytest.raises(ValueError, match="real model"):
        reference.load_model("flash")
    with pytest.raises(ValueError, match="checkpoint"):
        reference.load_model("/nonexistent/dir")
    with pytest.raises(ValueError, match="profile"):
        reference.load_model(str(tiny_path), profile="fp8")
    with pytest.raises(ValueError, match="dtype"):
        reference.load_model(str(tiny_path), dtype=torch.float16)
