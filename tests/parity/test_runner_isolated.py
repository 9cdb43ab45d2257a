"""Driving models: propagated capture, isolated mode feeding the anchor's layer inputs."""
from __future__ import annotations

import pytest
import torch

from dsv4.probes import probe_names
from parity.errors import SurfaceError
from parity.runner import SideOutput, run_isolated, run_propagated

from .fakes import FakeModel


def test_propagated_captures_every_probe_in_execution_order(tiny) -> None:
    c = tiny.config
    out = run_propagated(FakeModel(c, tiny.fingerprint), torch.arange(40) % c.vocab_size)
    kinds = [c.layer_kind(i) for i in range(c.num_hidden_layers)]
    assert list(out.probes) == probe_names(c.num_hidden_layers, kinds)
    assert out.streams.shape == (40, c.hc_mult, c.hidden_size)
    assert out.logits.dtype == torch.float32 and out.seconds["forward"] > 0


def test_isolated_feeds_each_layer_the_anchors_input(tiny) -> None:
    c = tiny.config
    ids = torch.arange(50) % c.vocab_size
    anchor = run_propagated(FakeModel(c, tiny.fingerprint), ids)
    test = FakeModel(c, tiny.fingerprint, noise=0.05)
    seen: dict[int, torch.Tensor] = {}
    original_layer = test.layer

    def spy(i, X, state):
        seen[i] = X
        return original_layer(i, X, state)

    test.layer = spy
    probes, seconds = run_isolated(test, ids, anchor, c.num_hidden_layers)
    assert torch.equal(seen[0], anchor.streams)
    for i in range(1, c.num_hidden_layers):
        assert torch.equal(seen[i], anchor.probes[f"layers.{i - 1}.out"])
    assert set(probes) == set(anchor.probes) and seconds > 0
    # the head of the isolated run saw the anchor's last layer output, so hc_head differs only by noise
    assert test.calls[-1] == "head"


def test_isolated_needs_the_anchors_layer_outputs(tiny) -> None:
    c = tiny.config
    ids = torch.arange(20) % c.vocab_size
    anchor = run_propagated(FakeModel(c, tiny.fingerprint), ids)
    partial = SideOutput({k: v for k, v in anchor.probes.items() if k != "layers.1.out"}, anchor.streams)
    with pytest.raises(SurfaceError, match="layers.1.out"):
        run_isolated(FakeModel(c, tiny.fingerprint), ids, partial, c.num_hidden_layers)


def test_a_model_without_logits_probe_is_a_surface_error(tiny) -> None:
    class Silent(FakeModel):
        def __call__(self, ids):
            from dsv4.probes import suspended

            with suspended():
                return super().__call__(ids)

    with pytest.raises(SurfaceError, match="logits"):
        run_propagated(Silent(tiny.config, tiny.fingerprint), torch.arange(10))
