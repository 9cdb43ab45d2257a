"""Before the first forward, a native model that cannot fit its GPUs stops the run with one error
(parity.fit_check): the model, the device, both sizes, the GPUs a device map needs; a model that fits,
or a CPU run, is not stopped. On one GPU without a device map a model larger than the card streams
(dsv4.streamed), and only one whose embedding, head and largest layer do not fit at once is stopped."""
from __future__ import annotations

import pytest

from dsv4.config import preset
from dsv4.plan import PrecisionPlan
from parity.errors import ParityInputError
from parity.fit_check import check_native_fits, streamed_floor, streams_native

GB80 = 80 * 10**9


def on(devs: dict[str, int]):
    return lambda d: devs.get(d)


def test_full_pro_on_one_80gb_card_streams_and_a_device_map_too_small_is_one_clear_error() -> None:
    pro, plan = preset("pro"), PrecisionPlan.preset("default")
    one = on({"cuda:0": GB80})
    assert streams_native(pro, plan, "cuda:0", memory_of=one)
    check_native_fits(pro, plan, ["floor", "bug_budget"], "cuda:0", memory_of=one)    # streamed: passes
    everything_on_0 = {k: "cuda:0" for k in ["embed", "head", *range(pro.num_hidden_layers)]}
    assert not streams_native(pro, plan, "cuda:0", everything_on_0, memory_of=one)   # a map: built whole
    with pytest.raises(ParityInputError, match=r"native default \(floor / bug budget\): 8\d\d\.\d GiB of weights on "
                                               r"cuda:0, which holds 74.5 GiB in all: expected a device map .* at "
                                               r"least 12 such GPUs .* found 1 device\(s\) \['cuda:0'\]"):
        check_native_fits(pro, plan, ["floor", "bug_budget"], "cuda:0", everything_on_0, memory_of=one)


def test_a_streamed_model_whose_largest_layer_does_not_fit_is_one_clear_error() -> None:
    pro, plan = preset("pro"), PrecisionPlan.preset("default")
    need, layer, largest = streamed_floor(pro, PrecisionPlan.preset("all-fp32"))
    assert largest > GB80 > need - largest      # Pro's FP32 layer alone is larger than an 80 GB card
    with pytest.raises(ParityInputError, match=rf"native all-fp32 \(logic\): streamed on cuda:0 \(74.5 GiB\).*"
                                               rf"largest layer \(layer {layer}, \d+\.\d GiB\).*--columns floor,bug_budget"):
        check_native_fits(pro, plan, ["logic", "floor"], "cuda:0", memory_of=on({"cuda:0": GB80}))
    check_native_fits(pro, plan, ["logic", "floor"], "cuda:0", memory_of=on({"cuda:0": 2 * largest}))


def test_a_device_map_that_spreads_it_enough_passes() -> None:
    pro, plan = preset("pro"), PrecisionPlan.preset("default")
    n = 16
    dmap = {i: f"cuda:{i * n // pro.num_hidden_layers}" for i in range(pro.num_hidden_layers)}
    dmap.update(embed="cuda:0", head=f"cuda:{n - 1}")
    mem = on({f"cuda:{i}": GB80 for i in range(n)})
    check_native_fits(pro, plan, ["floor", "bug_budget"], "cuda:0", dmap, memory_of=mem)
    with pytest.raises(ParityInputError, match="on cuda:0"):      # 2 cards: still too little on each
        half = {i: f"cuda:{i * 2 // pro.num_hidden_layers}" for i in range(pro.num_hidden_layers)}
        check_native_fits(pro, plan, ["floor"], "cuda:0", half, memory_of=mem)


def test_small_models_cpu_runs_and_reference_only_runs_are_not_stopped() -> None:
    plan = PrecisionPlan.preset("default")
    check_native_fits(preset("tiny"), plan, ["logic", "floor", "bug_budget"], "cuda:0", memory_of=on({"cuda:0": GB80}))
    check_native_fits(preset("pro"), plan, ["floor"], "cpu", memory_of=on({}))           # the host: not judged here
    check_native_fits(preset("pro"), plan, [], "cuda:0", memory_of=on({"cuda:0": 1}))   # nothing native built


def test_run_threeway_stops_before_any_model_is_loaded(tiny, chat_prompts, monkeypatch) -> None:
    from parity import fit_check
    from parity.threeway import RunSpec, run_threeway

    calls: list[str] = []

    from parity.runner import DefaultLoaders

    class Loaders(DefaultLoaders):      # the project's models, with every load recorded
        def reference(self, *a, **k):
            calls.append("reference")
            raise AssertionError("no model may load")

        native = reference

    monkeypatch.setattr(fit_check, "device_memory", lambda d: 1024)   # a 1 KiB "device"
    spec = RunSpec(source=tiny, prompts=chat_prompts, device="cpu", columns=("floor",))
    with pytest.raises(ParityInputError, match=r"streamed on cpu \(0\.0 GiB\), it needs its embedding"):
        run_threeway(spec, Loaders())
    assert calls == []


def test_loaders_of_ones_own_are_not_judged(tiny, chat_prompts, monkeypatch) -> None:
    """A loader that is not the project's may build anything (an engine, a remote model): not checked."""
    from parity import fit_check
    from parity.threeway import RunSpec, run_threeway

    monkeypatch.setattr(fit_check, "device_memory", lambda d: 1024)

    class Own:
        def reference(self, *a, **k):
            raise RuntimeError("reached the loaders")

        native = reference

    spec = RunSpec(source=tiny, prompts=chat_prompts, device="cpu", columns=("floor",))
    result = run_threeway(spec, Own())
    assert "reached the loaders" in result.columns["floor"].reason
