"""A backend serving dense weights through more than one kernel (``weight_routes``) has each route's
weight reads audited: a fault in one route is found and named with it, the clean route stays clean,
and the weights are counted once."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4.layers.grouped_linear import Fp4GroupedLinear
from dsv4.model import load_model
from parity.audit import weights

FAULTY = "layers.0.attn.wq_b"


@pytest.fixture(scope="module")
def model(tiny):
    return load_model(str(tiny.path), plan="default")


class TwoRoutes:
    """The model's own backend as two routes; the second swaps the nibbles of ``FAULTY``'s weight."""

    name = "two-routes"

    def __init__(self, inner, faulty_ptr: int | None) -> None:
        self.inner, self.faulty_ptr = inner, faulty_ptr
        self.calls = {"clean": 0, "faulty": 0}

    def _faulty(self, req):
        self.calls["faulty"] += 1
        b = req.b
        if b.packed.data_ptr() == self.faulty_ptr:
            b = dataclasses.replace(b, packed=(b.packed >> 4) | (b.packed << 4))
        return self.inner.gemm(dataclasses.replace(req, b=b))

    def _clean(self, req):
        self.calls["clean"] += 1
        return self.inner.gemm(req)

    def weight_routes(self):
        return [("clean route", self._clean), ("faulty route", self._faulty)]

    def grouped_gemm(self, req):
        return self.inner.grouped_gemm(req)


def _dense(model):
    return [m for m in weights.fp4_modules(model) if not isinstance(m, Fp4GroupedLinear)]


def test_a_fault_in_one_route_is_found_and_named(model):
    mods = {m.name: m for m in weights.fp4_modules(model)}
    inner = mods[FAULTY].dispatcher.backend
    be = TwoRoutes(inner, mods[FAULTY].weight_operand().packed.data_ptr())
    wa = weights.audit_weights(model, be, chunk_rows=64)
    assert not wa.passed
    assert {(m.module, m.route) for m in wa.mismatches} == {(FAULTY, "faulty route")}
    assert {m.passname for m in wa.mismatches} == {"codes*scales (global 1.0)", "with global scale"}
    assert "via faulty route" in wa.mismatches[0].describe()
    assert be.calls["clean"] > 0 and be.calls["faulty"] > be.calls["clean"]   # pass 1 on the faulty one only
    # every dense weight went through both routes, counted once
    one_route = weights.audit_weights(model, inner, chunk_rows=64)
    assert wa.weights == one_route.weights and wa.modules == one_route.modules
    assert wa.passes_run == one_route.passes_run + len(_dense(model)) + 1


def test_a_clean_multi_route_backend_passes(model):
    inner = _dense(model)[0].dispatcher.backend
    be = TwoRoutes(inner, None)
    wa = weights.audit_weights(model, be, chunk_rows=64)
    assert wa.passed and wa.passes_run == len(weights.fp4_modules(model)) + len(_dense(model))


def test_a_backend_without_routes_is_its_own_gemm(model):
    inner = _dense(model)[0].dispatcher.backend
    assert [label for label, _ in weights.dense_routes(inner)] == [""]
    assert weights.dense_routes(inner)[0][1] == inner.gemm


def test_sm90_backend_lists_the_prefill_route_while_it_is_on(monkeypatch):
    pytest.importorskip("cutlass", reason="CuTe DSL not installed")
    from dsv4.kernels.cutedsl.sm90 import prefill_route
    from dsv4.kernels.cutedsl.sm90.backend import Sm90Backend

    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", True)
    assert [r for r, _ in Sm90Backend("cuda").weight_routes()] == ["generic kernel", "prefill route"]
    assert [r for r, _ in Sm90Backend("cuda", routes=False).weight_routes()] == ["generic kernel"]
    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", False)
    assert [r for r, _ in Sm90Backend("cuda").weight_routes()] == ["generic kernel"]


@pytest.mark.gpu
@pytest.mark.sm90
def test_sm90_weight_audit_reads_both_routes_and_finds_a_prefill_dequant_fault(tiny, monkeypatch):
    """On Hopper with the prefill route on: every dense weight through the generic kernel and through
    PrefillGemm, clean; then PrefillGemm's dequantization of the weight made to read each 16-element
    block's scale from the block after it: found via the prefill route only."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90 import prefill_route
    from dsv4.kernels.cutedsl.sm90.prefill_gemm import PrefillGemm

    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", True)
    model = load_model(str(tiny.path), plan="default", backend="cutedsl_sm90", device="cuda")
    dense = len(_dense(model))
    wa = weights.audit_weights(model)
    assert wa.passed and wa.passes_run == len(weights.fp4_modules(model)) + dense

    weight_ptrs = {m.weight_operand().packed.data_ptr() for m in _dense(model)}
    clean = PrefillGemm.dequant

    def neighbour_scales(self, op):
        if op.packed.data_ptr() not in weight_ptrs:
            return clean(self, op)
        s = op.scales.view(torch.uint8)
        shifted = torch.cat([s.reshape(-1)[1:], s.reshape(-1)[:1]]).reshape(s.shape).view(op.scales.dtype)
        return clean(self, dataclasses.replace(op, scales=shifted))

    monkeypatch.setattr(PrefillGemm, "dequant", neighbour_scales)
    bad = weights.audit_weights(model)
    assert not bad.passed
    assert {m.route for m in bad.mismatches} == {"prefill route"}
    assert {m.module for m in bad.mismatches} == {m.name for m in _dense(model)}


def test_a_fault_around_a_multi_route_backend_reaches_every_route(model):
    """The bug zoo injects kernel faults around a real backend (``FaultAround``); its routes must carry
    the fault, or the weight audit would read past it."""
    from parity.bugzoo.around import Around
    from parity.bugzoo.backends import scale_from_neighbour

    inner = _dense(model)[0].dispatcher.backend
    wrapped = Around(weight_scale_bytes=scale_from_neighbour).wrap(TwoRoutes(inner, None))
    wa = weights.audit_weights(model, wrapped, chunk_rows=64)
    assert {m.route for m in wa.mismatches if m.expert is None} == {"clean route", "faulty route"}
    plain = Around(weight_scale_bytes=scale_from_neighbour).wrap(inner)
    assert [label for label, _ in plain.weight_routes()] == [""]
    assert not weights.audit_weights(model, plain, chunk_rows=64).passed
