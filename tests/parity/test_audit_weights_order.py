"""The weight audit runs the global-scale pass first and the global-1.0 pass only where it found
something: a clean backend costs one identity pass, and a faulty one gets exactly the findings, in the
order, that running both passes over every weight gives (written out here as ``_two_passes``)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dsv4.kernels.contract import FP4Operand
from dsv4.layers.grouped_linear import Fp4GroupedLinear
from dsv4.model import load_model
from parity.audit import weights
from parity.audit.calls import linear_scales

GLOBAL_ONE, WITH_G = "codes*scales (global 1.0)", "with global scale"
CHUNK = 64
BANK = "layers.0.ffn.experts.w13"
NIBBLE_DENSE, NO_G_DENSE = "layers.0.attn.wq_b", "layers.1.attn.wkv"
NIBBLE_EXPERTS, OTHER_ALPHA_EXPERT = (1, 5), 3      # the bank's faulty experts; expert 3 gets expert 0's alpha


@pytest.fixture(scope="module")
def model(tiny):
    return load_model(str(tiny.path), plan="default")


@pytest.fixture(scope="module")
def mods(model):
    return {m.name: m for m in weights.fp4_modules(model)}


def _swap_nibbles(packed: torch.Tensor, rows: slice) -> torch.Tensor:
    p = packed.clone()
    p[rows] = (p[rows] >> 4) | (p[rows] << 4)
    return p


class Backend:
    """The model's own backend with calls noted (kind, whether the weight's global scale is 1.0, the
    experts served) and, given the module table, faults: nibble order swapped in ``NIBBLE_DENSE`` and
    the bank's ``NIBBLE_EXPERTS``; ``NO_G_DENSE``'s global scale ignored; the bank's expert 3 scaled with
    expert 0's alpha (the last two show with the stored global scale only)."""

    def __init__(self, inner, mods=None) -> None:
        self.inner, self.name, self.calls = inner, "noting", []
        ptr = (lambda m: m.weight_operand().packed.data_ptr()) if mods else (lambda m: None)
        self.nibble, self.no_g, self.bank = (ptr(mods[x]) if mods else None for x in (NIBBLE_DENSE, NO_G_DENSE, BANK))
        self.n = mods[BANK].n_per_group if mods else 0

    def gemm(self, req):
        b = req.b
        self.calls.append(("gemm", bool((b.global_scale == 1).all()), None))
        if b.packed.data_ptr() == self.nibble:
            b = dataclasses.replace(b, packed=_swap_nibbles(b.packed, slice(None)))
        if b.packed.data_ptr() == self.no_g:
            b = dataclasses.replace(b, global_scale=torch.ones_like(b.global_scale))
        return self.inner.gemm(dataclasses.replace(req, b=b))

    def grouped_gemm(self, req):
        served = tuple((req.offsets[1:] > req.offsets[:-1]).nonzero().flatten().tolist())
        self.calls.append(("grouped", bool((req.alphas == 1).all()), served))
        if req.b.packed.data_ptr() == self.bank:
            packed, n = req.b.packed, self.n
            for e in NIBBLE_EXPERTS:
                packed = _swap_nibbles(packed, slice(e * n, (e + 1) * n))
            alphas, g = req.alphas.clone(), req.b.global_scale.clone()     # kept consistent (validated)
            alphas[OTHER_ALPHA_EXPERT], g[OTHER_ALPHA_EXPERT] = alphas[0], g[0]
            req = dataclasses.replace(req, b=dataclasses.replace(req.b, packed=packed, global_scale=g), alphas=alphas)
        return self.inner.grouped_gemm(req)


def _two_passes(model, be) -> list[weights.WeightMismatch]:
    """The audit as it was: both passes over every weight (whole K at once, one expert a call), a dense
    module's pass 1 before its pass 2, a bank's findings by (expert, pass)."""
    out = []
    for mod in weights.fp4_modules(model):
        w = mod.weight_operand()
        k = w.k
        bank = isinstance(mod, Fp4GroupedLinear)
        E, n = (mod.groups, mod.n_per_group) if bank else (1, w.rows)
        scales = linear_scales(w, rows=E * n, groups=E) if bank else linear_scales(w)
        for e in range(E):
            for passname, g in weights._passes(w.global_scale.reshape(E) if bank else w.global_scale):
                op = FP4Operand(w.packed, w.scales, g, k=k, scale_layout=w.scale_layout)
                got = weights._bank_view(be, op, range(e, e + 1), range(k)) if bank else \
                    weights._kernel_view(be.gemm, op, range(k))
                want = weights._reference_view(w.packed[e * n:(e + 1) * n], scales[e * n:(e + 1) * n],
                                               (g[e] if bank else g).to(torch.float32), k).T.to(torch.bfloat16)
                bad, ex = weights._compare(got, want, 0)
                if bad:
                    out.append(weights.WeightMismatch(mod.name, mod.component, e if bank else None, passname,
                                                      bad, n * k, ex))
    return out


def _one_pass_calls(mods, chunk: int) -> int:
    total = 0
    for m in mods.values():
        k, chunks = m.weight_operand().k, math.ceil(m.weight_operand().k / chunk)
        if isinstance(m, Fp4GroupedLinear):
            batch = max(1, weights.BATCH_ELEMENTS // (min(chunk, k) * m.n_per_group))
            chunks *= math.ceil(m.groups / batch)
        total += chunks
    return total


def test_clean_backend_costs_one_identity_pass(model, mods) -> None:
    assert all(not bool((m.weight_operand().global_scale == 1).any()) for m in mods.values())
    be = Backend(next(iter(mods.values())).dispatcher.backend)
    wa = weights.audit_weights(model, be, chunk_rows=CHUNK)
    assert wa.passed and wa.modules == len(mods) and wa.weights > 10 ** 6
    assert len(be.calls) == _one_pass_calls(mods, CHUNK)
    assert not any(one for _, one, _ in be.calls)                  # every call is the global-scale pass
    assert wa.passes_run == wa.modules and wa.summary()["passes_run"] == wa.modules


def test_findings_are_those_of_both_passes_everywhere(model, mods, monkeypatch) -> None:
    monkeypatch.setattr(weights, "BATCH_ELEMENTS", 2 * CHUNK * mods[BANK].n_per_group)   # 2 experts a call
    inner = next(iter(mods.values())).dispatcher.backend
    be = Backend(inner, mods)
    wa = weights.audit_weights(model, be, chunk_rows=CHUNK)
    want = _two_passes(model, Backend(inner, mods))
    assert [m.__dict__ for m in wa.mismatches] == [m.__dict__ for m in want]

    found = {(m.module, m.expert): {} for m in want}
    for m in want:
        found[m.module, m.expert][m.passname] = m.mismatches
    # a codes fault: both passes, the same weights; a global-scale fault: only with the global scale
    for where in [(NIBBLE_DENSE, None)] + [(BANK, e) for e in NIBBLE_EXPERTS]:
        assert found.pop(where).keys() == {GLOBAL_ONE, WITH_G}
    for where in ((NO_G_DENSE, None), (BANK, OTHER_ALPHA_EXPERT)):
        assert found.pop(where).keys() == {WITH_G}
    assert not found
    nib = [m for m in wa.mismatches if m.module == NIBBLE_DENSE]
    assert [m.passname for m in nib] == [GLOBAL_ONE, WITH_G] and nib[0].mismatches == nib[1].mismatches > 0

    # pass 1 ran on the two faulty dense modules and, in the bank, on its faulty experts only (2 a call)
    k = {name: mods[name].weight_operand().k for name in mods}
    one = [c for c in be.calls if c[1]]
    assert sum(1 for c in one if c[0] == "gemm") == sum(math.ceil(k[x] / CHUNK) for x in (NIBBLE_DENSE, NO_G_DENSE))
    assert sorted({c[2] for c in one if c[0] == "grouped"}) == [(1, 3), (5,)]
    assert len(be.calls) == _one_pass_calls(mods, CHUNK) + len(one)
    assert wa.passes_run == wa.modules + 3

    ctx = type("Ctx", (), {"record": staticmethod(lambda **kw: kw)})()
    old = weights.WeightAudit(wa.backend, wa.modules, wa.weights, want, wa.audited)
    assert weights.weight_records(wa, ctx, "p", "m") == weights.weight_records(old, ctx, "p", "m")
    assert {k: v for k, v in wa.summary().items() if k != "passes_run"} == \
        {k: v for k, v in old.summary().items() if k != "passes_run"}
