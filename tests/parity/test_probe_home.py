"""A test forward's probes stay on the GPU when they fit (parity.probe_home): the same records as with
them on the host, a fallback to the host when the device runs out of memory, and the CPU unchanged."""
from __future__ import annotations

import pytest
import torch

from parity import probe_home, threeway
from parity.bugzoo.backends import CLEAN_KERNEL, installed
from parity.threeway import RunSpec, run_threeway


def test_probe_bytes_counts_tensors_only() -> None:
    assert probe_home.probe_bytes({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.int64), "c": 7}) == 88


def test_nothing_is_device_resident_on_the_cpu() -> None:
    assert not probe_home.fits_on_device(0, "cpu")
    assert probe_home.anchor_on_device({"x": torch.zeros(4)}, "cpu") is None


def test_a_host_anchor_goes_up_only_with_room_for_the_test_probes_too(monkeypatch) -> None:
    asked: list[int] = []
    room = {"fits": True}

    def fits(nbytes, device):
        asked.append(nbytes)
        return room["fits"]

    monkeypatch.setattr(probe_home, "fits_on_device", fits)
    probes = {"a": torch.ones(3, 4), "note": "kept"}
    up = probe_home.anchor_on_device(probes, "cpu")
    assert asked == [2 * 48] and up is not None and up["note"] == "kept" and torch.equal(up["a"], probes["a"])
    room["fits"] = False
    assert probe_home.anchor_on_device(probes, "cpu") is None
    monkeypatch.setattr(probe_home, "is_on_device", lambda p: True)     # on the device already: nothing to do
    room["fits"] = True
    assert probe_home.anchor_on_device(probes, "cpu") is None


def test_out_of_memory_on_the_device_is_retried_on_the_host() -> None:
    tries, released = [], []

    def run(on_device: bool) -> str:
        tries.append(on_device)
        if on_device:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return "host result"

    assert probe_home.run_with_home(run, True, lambda: released.append(1)) == ("host result", False)
    assert tries == [True, False] and released == [1]
    tries.clear()
    assert probe_home.run_with_home(run, False, lambda: released.append(2)) == ("host result", False)
    assert tries == [False] and released == [1]


def test_other_errors_are_not_retried() -> None:
    def run(on_device: bool) -> None:
        raise ValueError("a forward's own error")

    with pytest.raises(ValueError, match="own error"):
        probe_home.run_with_home(run, True, lambda: None)


def _records(tiny, prompts, monkeypatch, resident: bool) -> tuple[list[tuple], list[bool]]:
    homes: list[bool] = []
    real, real_up = threeway.run_with_home, threeway.anchor_on_device

    def spy(run, on_device, release):
        out = real(run, on_device, release)
        homes.append(out[1])
        return out

    def up_spy(probes, device):
        out = real_up(probes, device)
        homes.append(out is not None)
        return out

    monkeypatch.setattr(threeway, "run_with_home", spy)
    monkeypatch.setattr(threeway, "anchor_on_device", up_spy)
    if not resident:
        monkeypatch.setattr(threeway, "fits_on_device", lambda *_: False)
        monkeypatch.setattr(probe_home, "fits_on_device", lambda *_: False)
    with installed(CLEAN_KERNEL) as name:
        spec = RunSpec(source=tiny, prompts=prompts, backend=name, device="cuda", columns=("floor", "bug_budget"))
        result = run_threeway(spec).raise_errors()
    keys = sorted((r["pair"], r["compare_mode"], r["prompt_id"], r["probe"], r["metric"], str(r.get("position")),
                   r["value"]) for r in result.records if r["compare_mode"] != "audit" or r["metric"] != "seconds")
    return keys, homes


@pytest.mark.gpu
def test_device_resident_probes_give_the_host_records(tiny, chat_prompts, monkeypatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    on_dev, homes_dev = _records(tiny, chat_prompts, monkeypatch, resident=True)
    monkeypatch.undo()
    on_host, homes_host = _records(tiny, chat_prompts, monkeypatch, resident=False)
    # every test forward's probes stayed on the GPU; the floor column's host anchors went up once a prompt
    # (the bug-budget column's, the floor's outputs, were there already)
    assert homes_dev and sum(homes_dev) >= len(homes_dev) - len(chat_prompts), homes_dev
    assert homes_host and not any(homes_host)
    assert len(on_dev) > 500 and on_dev == on_host


def test_a_forward_run_again_does_not_count_its_calls_twice(tiny) -> None:
    from dsv4.model import load_model
    from parity.audit import CallAuditor

    ids = torch.arange(1, 17) % tiny.config.vocab_size
    with installed(CLEAN_KERNEL) as name:
        model = load_model(str(tiny.path), plan="default", backend=name)
        auditor = CallAuditor()
        with auditor.attached(model):
            model(ids)
            once = (auditor.calls, dict(auditor.call_counts), auditor.summary())
            snap = auditor.snapshot()
            model(ids)                       # the abandoned attempt
            assert auditor.calls == 2 * once[0]
            auditor.restore(snap)
            assert (auditor.calls, dict(auditor.call_counts), auditor.summary()) == once
            model(ids)                       # the retry counts from where the snapshot was taken
            assert auditor.calls == 2 * once[0]


class _OomOnce:
    """Loaders whose first native build runs out of device memory."""

    def __init__(self) -> None:
        self.builds = 0

    def native(self, path: str, **kw) -> str:
        self.builds += 1
        if self.builds == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return "model"


def test_a_model_that_does_not_fit_beside_device_anchors_moves_them_to_the_host(tiny, monkeypatch) -> None:
    from dsv4.plan import PrecisionPlan
    from parity.runner import SideOutput

    anchors = [SideOutput({"x": torch.zeros(2)}, torch.zeros(1))]
    loaders = _OomOnce()
    runner = threeway._Runner(RunSpec(source=tiny, prompts=[]), loaders, None)
    monkeypatch.setattr(threeway, "is_on_device", lambda probes: True)
    monkeypatch.setattr(threeway, "to_host", lambda probes: {"moved": True})
    assert runner._load_native(PrecisionPlan.preset("default"), "emulated", anchors) == "model"
    assert loaders.builds == 2 and anchors[0].probes == {"moved": True}


def test_without_device_anchors_running_out_of_memory_is_not_retried(tiny) -> None:
    from dsv4.plan import PrecisionPlan
    from parity.runner import SideOutput

    loaders = _OomOnce()
    runner = threeway._Runner(RunSpec(source=tiny, prompts=[]), loaders, None)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        runner._load_native(PrecisionPlan.preset("default"), "emulated", [SideOutput({"x": torch.zeros(2)},
                                                                                    torch.zeros(1))])
    assert loaders.builds == 1
