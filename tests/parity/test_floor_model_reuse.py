"""The bug-budget column runs the floor column's model on the kernel backend (``NativeModel.switch_backend``
through ``DefaultLoaders.rebackend``) instead of building it again from the checkpoint: the same records as
a fresh build, one native build fewer, and never for loaders that build their own native models (a fault
injection must build its kernel model itself)."""
from __future__ import annotations

import pytest
import torch

import dsv4
from parity.runner import DefaultLoaders
from parity.threeway import RunSpec, run_threeway

pytest.importorskip("tiled_gemm_backend")


class Counting(DefaultLoaders):
    """DefaultLoaders with native builds counted (its own ``native``: so never reused)."""

    def __init__(self) -> None:
        self.builds: list[str] = []

    def native(self, path, *, plan, backend, device, device_map):
        self.builds.append(backend)
        return super().native(path, plan=plan, backend=backend, device=device, device_map=device_map)


def _keys(result) -> list[tuple]:
    return sorted((r["pair"], r["compare_mode"], r["prompt_id"], r["probe"], r["metric"], str(r.get("position")),
                   r["value"]) for r in result.records if r["compare_mode"] != "audit" or r["metric"] != "seconds")


def test_reused_floor_model_gives_the_fresh_builds_records(tiny, chat_prompts, monkeypatch) -> None:
    spec = RunSpec(source=tiny, prompts=chat_prompts, backend="tiled_gemm", device="cpu",
                   columns=("floor", "bug_budget"))
    built: list[str] = []
    real = dsv4.load_model

    def counted(*a, **k):
        built.append(k["backend"])
        return real(*a, **k)

    monkeypatch.setattr(dsv4, "load_model", counted)
    reused = run_threeway(spec).raise_errors()
    assert built == ["emulated"], built                      # the kernel column borrowed the floor's model
    fresh_loaders = Counting()
    fresh = run_threeway(spec, fresh_loaders).raise_errors()
    assert fresh_loaders.builds == ["emulated", "tiled_gemm"]  # its own native(): built twice, never borrowed
    assert len(_keys(reused)) > 500 and _keys(reused) == _keys(fresh)
    bb = reused.columns["bug_budget"]
    assert bb.ran and bb.test_describe["backend"] == "tiled_gemm" and not bb.kernels_missing


def test_switch_backend_moves_every_dispatcher_and_expectation() -> None:
    model = dsv4.load_model("tiny", plan="default", backend="emulated", device="cpu")
    model(torch.tensor([1, 2, 3]))
    model.switch_backend("tiled_gemm")
    assert model.backend_names() == {"cpu": "tiled_gemm"} and model.describe()["backend"] == "tiled_gemm"
    assert not model.kernel_log                              # the log starts over
    assert {b for _, b in model._log.expected.values()} == {"tiled_gemm"}
    with pytest.raises(Exception, match="unknown backend"):
        model.switch_backend("no_such_backend")
    assert model.backend_names() == {"cpu": "tiled_gemm"}   # nothing changed on a bad name
    model(torch.tensor([1, 2, 3]))
    model.assert_kernels_ran()


@pytest.mark.gpu
def test_reuse_on_the_gpu_kernel_backend_gives_the_fresh_builds_records(tiny, chat_prompts) -> None:
    """The same on a GPU with the real kernel backend (cutedsl_sm90 on Hopper): the switched model's records
    and audit equal a fresh kernel build's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    from parity.threeway import resolve_kernel_backend

    kernel, reason = resolve_kernel_backend("auto", "cuda")
    if kernel is None:
        pytest.skip(f"needs a CUDA GPU with a kernel backend: {reason}")
    spec = RunSpec(source=tiny, prompts=chat_prompts, backend=kernel, device="cuda", columns=("floor", "bug_budget"))
    reused = run_threeway(spec).raise_errors()
    loaders = Counting()
    fresh = run_threeway(spec, loaders).raise_errors()
    assert loaders.builds == ["emulated", kernel]
    assert _keys(reused) == _keys(fresh)
    assert reused.columns["bug_budget"].audit["violations"] == 0
