"""Compressor (spec §6): per-channel convex pooling, position bias on the gates only, overlapping
CSA halves, entries only at block boundaries, RoPE at j·m, chunking invariance."""
from __future__ import annotations

import torch

from reference.compressor import Compressor, CompressorWeights, pool, project
from reference.ops import rms_norm
from reference.rope import RopeSpec, apply_rope, cos_sin
from reference.state import CompressorState

D, C = 32, 16
ROPE = RopeSpec(8, 160000.0, None)


def make(ratio: int, overlap: bool, seed: int = 0, ape: torch.Tensor | None = None,
         zero_gate: bool = False) -> Compressor:
    g = torch.Generator().manual_seed(seed)
    k = 2 if overlap else 1
    wkv, wgate = torch.randn(k * C, D, generator=g) / D ** 0.5, torch.randn(k * C, D, generator=g)
    drawn_ape, norm = torch.randn(ratio, k * C, generator=g), 1 + 0.1 * torch.randn(C, generator=g)
    w = CompressorWeights(wkv, torch.zeros_like(wgate) if zero_gate else wgate,
                          drawn_ape if ape is None else ape, norm)
    return Compressor(w, ratio, overlap, ROPE, 1e-6)


def test_pool_is_a_per_channel_convex_combination() -> None:
    g = torch.Generator().manual_seed(1)
    for overlap in (False, True):
        c, z = torch.randn(3, 4, 2 * C, generator=g), 3 * torch.randn(3, 4, 2 * C, generator=g)
        out = pool(c, z, None, None, overlap)
        if overlap:   # slots of entry j: a-half of block j−1 (none for j = 0) and b-half of block j
            slots_c = [c[0, :, C:]] + [torch.cat((c[j - 1, :, :C], c[j, :, C:])) for j in (1, 2)]
            slots_z = [z[0, :, C:]] + [torch.cat((z[j - 1, :, :C], z[j, :, C:])) for j in (1, 2)]
        else:
            slots_c, slots_z = list(c), list(z)
        for j in range(3):
            w = torch.softmax(slots_z[j], dim=0)
            assert torch.allclose(out[j], (w * slots_c[j]).sum(0), atol=1e-6)
            assert bool((out[j] <= slots_c[j].max(0).values + 1e-6).all())
            assert bool((out[j] >= slots_c[j].min(0).values - 1e-6).all())


def test_position_bias_shift_of_a_block_changes_nothing() -> None:
    x = torch.randn(32, D, generator=torch.Generator().manual_seed(2))
    for ratio, overlap in ((4, True), (16, False)):
        base = make(ratio, overlap)
        shifted = make(ratio, overlap, ape=base.w.ape + 7.25)
        a, _ = base(x, 0, CompressorState())
        b, _ = shifted(x, 0, CompressorState())
        assert a.shape[0] == 32 // ratio
        assert torch.allclose(a, b, atol=1e-5)
        other = make(ratio, overlap, ape=base.w.ape + torch.randn(base.w.ape.shape))
        assert not torch.allclose(other(x, 0, CompressorState())[0], a, atol=1e-3)   # the bias does matter


def test_position_bias_goes_to_the_gate_never_to_the_content() -> None:
    ape = torch.zeros(4, C)
    ape[2] = 1000.0                          # token 2 of every block takes all the weight
    comp = make(4, False, ape=ape, zero_gate=True)
    x = torch.randn(8, D, generator=torch.Generator().manual_seed(3))
    c, z = project(x, comp.w, torch.arange(8), 4)
    assert torch.equal(c, (x.double() @ comp.w.wkv.double().T).float())   # content: no bias
    pooled = pool(c.view(2, 4, C), z.view(2, 4, C), None, None, False)
    assert torch.allclose(pooled, c.view(2, 4, C)[:, 2], atol=1e-6)


def test_csa_overlap_uniform_gates() -> None:
    comp = make(4, True, ape=torch.zeros(4, 2 * C), zero_gate=True)
    x = torch.randn(12, D, generator=torch.Generator().manual_seed(4))
    c, z = project(x, comp.w, torch.arange(12), 4)
    out = pool(c.view(3, 4, 2 * C), z.view(3, 4, 2 * C), None, None, True)
    assert torch.allclose(out[0], c[0:4, C:].mean(0), atol=1e-6)                          # j = 0: block 0 (b) only
    assert torch.allclose(out[2], torch.cat((c[4:8, :C], c[8:12, C:])).mean(0), atol=1e-6)  # blocks 1 (a), 2 (b)


def test_hca_emits_an_entry_only_at_ratio_boundaries() -> None:
    comp, st = make(16, False), CompressorState()
    x = torch.randn(50, D, generator=torch.Generator().manual_seed(5))
    for t in range(50):
        new, j0 = comp(x[t:t + 1], t, st)
        assert new.shape[0] == (1 if (t + 1) % 16 == 0 else 0), t
        if new.shape[0]:
            assert j0 == t // 16
    assert st.n_pending == 50 % 16


def test_entries_are_normed_and_roped_at_block_start() -> None:
    comp = make(4, True)
    x = torch.randn(16, D, generator=torch.Generator().manual_seed(6))
    out, _ = comp(x, 0, CompressorState())
    c, z = project(x, comp.w, torch.arange(16), 4)
    pooled = pool(c.view(4, 4, 2 * C), z.view(4, 4, 2 * C), None, None, True)
    want = apply_rope(rms_norm(pooled, comp.w.norm, 1e-6), cos_sin(ROPE, torch.arange(4) * 4))
    assert torch.allclose(out, want, atol=1e-6)


def test_chunked_and_token_by_token_equal_one_prefill() -> None:
    x = torch.randn(45, D, generator=torch.Generator().manual_seed(7))
    for ratio, overlap in ((4, True), (16, False)):
        comp = make(ratio, overlap)
        whole, _ = comp(x, 0, CompressorState())
        for cuts in ([1] * 45, [3, 9, 1, 20, 12], [45]):
            st, parts, start = CompressorState(), [], 0
            for n in cuts:
                parts.append(comp(x[start:start + n], start, st)[0])
                start += n
            assert torch.allclose(torch.cat(parts), whole, atol=1e-6), (ratio, cuts)
            assert st.n_pending == 45 % ratio
