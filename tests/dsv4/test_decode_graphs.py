"""The CUDA-graph decoder replays the native model's decode step exactly (``gpu``; ``sm90`` for the CuTe
DSL backend). Every test decodes teacher-forced side by side with ``model.decode_step`` on its own
state and demands bitwise-equal logits at every step: across window wrap-around and CSA / HCA block
closes (steps 48 > 16), on any device index (the regression: graphs replaying zeros or stale data on
a non-default GPU), with two streams on one GPU, with the caller on a side stream. Summaries go to
``$OUT/decode_graphs.jsonl`` when ``OUT`` is set (the lead's H200 run)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import dsv4
from dsv4.decode.graphs import GraphDecoder, GraphMismatchError, bitwise_equal

pytestmark = pytest.mark.gpu
PROMPT = (torch.arange(40, dtype=torch.int64) * 11 + 2) % 512
STEPS = 48


def _log(test: str, **fields: Any) -> None:
    out = os.environ.get("OUT")
    if out:
        with open(Path(out) / "decode_graphs.jsonl", "a") as f:
            f.write(json.dumps({"test": test, **fields}, default=str) + "\n")


def _side_by_side(model: Any, dec: GraphDecoder, steps: int = STEPS) -> list[float]:
    """Max |eager - graph| per step (0.0 when bitwise equal); both states teacher-forced alike."""
    diffs = []
    dev = torch.device(model.device_map["head"])
    with torch.no_grad():
        with torch.cuda.device(dev):             # the eager baseline on the model's device ...
            le, se = model.prefill(PROMPT)
            _, sg = model.prefill(PROMPT)
        tok = int(le[-1].argmax())
        for _ in range(steps):
            with torch.cuda.device(dev):
                a = model.decode_step(se, tok)
            b = dec.step(sg, tok)                # ... the decoder from whatever device is current
            assert b.device == a.device and b.dtype == a.dtype and b.shape == a.shape
            diffs.append(0.0 if bitwise_equal(a, b) else float((a - b).abs().max()))
            tok = int(a.argmax())
    return diffs


def shared_sm90() -> str:
    """The sm_90 backend shared per device by every model this process loads (kernels compile once;
    test_decode_readiness.py and test_decode_gpu.py use it too). Never picked by ``auto``."""
    from dsv4.kernels.registry import register_shared_backend

    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    return register_shared_backend("cutedsl_sm90")


def _sm90_model(device: str) -> Any:
    model = dsv4.load_model("tiny", plan="default", backend=shared_sm90(), device=device)
    assert set(model.backend_names().values()) == {"cutedsl_sm90"}
    return model


@pytest.fixture(scope="module")
def sm90() -> Any:
    """One model for the cuda:0 tests: its backend compiles each kernel once (compiles are not cached
    across model loads), and every test drives it through its own decoder and states."""
    return _sm90_model("cuda:0")


def _modes(dec: GraphDecoder) -> dict[str, str]:
    return {s.name: s.mode for s in dec.report()}


@pytest.mark.sm90
@pytest.mark.parametrize("index", [0, 1])
def test_graph_replay_equals_eager_on_any_device_index(index: int, request: pytest.FixtureRequest) -> None:
    if index >= torch.cuda.device_count():
        pytest.skip(f"needs cuda:{index}; this machine has {torch.cuda.device_count()} CUDA device(s)")
    device = f"cuda:{index}"
    model = request.getfixturevalue("sm90") if index == 0 else _sm90_model(device)
    assert torch.cuda.current_device() == 0      # for index 1 the model is NOT on the current device
    dec = GraphDecoder(model, device=device)
    diffs = _side_by_side(model, dec)
    rep = dec.report()
    _log("any_device_index", device=device, diffs=diffs, segments=[s.__dict__ for s in rep])
    assert diffs == [0.0] * STEPS, diffs
    graphable = [s for s in rep if s.reason != "eager by design"]
    assert graphable and all(s.mode == "graph" for s in graphable), [(s.name, s.reason) for s in graphable]
    # every capturable piece sits in a graph; with the MoE dispatch capturable, a layer's attn_out, dispatch
    # and ffn chain into the next layer's attn_pre (or the head): L0.attn_pre alone, then one chain a layer
    graphed = {p for s in rep if s.mode == "graph" for p in s.pieces}
    L = len(model.blocks)
    want = {f"L{i}.{k}" for i in range(L) for k in ("attn_pre", "attn_out", "dispatch", "ffn")} | {"head"}
    assert graphed == want, sorted(want ^ graphed)
    assert sum(s.mode == "graph" for s in rep) == L + 1, [s.name for s in rep]


@pytest.mark.sm90
def test_two_streams_on_one_gpu_hand_off_exactly(sm90: Any) -> None:
    model = sm90
    dec = GraphDecoder(model, streams_per_device=2)
    diffs = _side_by_side(model, dec)
    rep = dec.report()
    _log("two_streams", diffs=diffs, segments=[s.__dict__ for s in rep])
    assert diffs == [0.0] * STEPS, diffs
    assert {s.stream for s in rep} == {0, 1}
    assert all(s.mode == "graph" for s in rep if s.reason != "eager by design")


@pytest.mark.sm90
def test_caller_on_a_side_stream_and_verified_replays(sm90: Any) -> None:
    model = sm90
    dec = GraphDecoder(model, verify=True)       # every replay re-checked against an eager run
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        diffs = _side_by_side(model, dec, steps=20)
    _log("side_stream_verified", diffs=diffs)
    assert diffs == [0.0] * 20, diffs


@pytest.mark.sm90
def test_a_baked_position_is_caught_as_stale_replay(sm90: Any) -> None:
    """Negative control: a piece that bakes the step's position (a Python int) into its graph captures
    fine and replays the capture step's value; the verified replay must refuse it."""
    model = sm90
    dec = GraphDecoder(model, verify=True)
    piece = next(p for p in dec.pieces if p.name == "L0.attn_pre")
    run = piece.run

    def baked() -> dict:
        out = run()
        q = out["L0.q"]
        out["L0.q"] = q + torch.full_like(q, float(dec.cur.start)) * 1e-2   # the bug under test
        return out

    piece.run = baked
    with pytest.raises(GraphMismatchError, match="L0.attn_pre"):
        _side_by_side(model, dec, steps=4)       # warm-up, capture (equal at its own step), then stale


def test_emulated_backend_on_cuda_falls_back_where_it_host_reads_and_stays_exact() -> None:
    model = dsv4.load_model("tiny", plan="default", backend="emulated", device="cuda:0")
    dec = GraphDecoder(model)
    diffs = _side_by_side(model, dec, steps=20)
    rep = dec.report()
    _log("emulated_default", diffs=diffs, segments=[s.__dict__ for s in rep])
    assert diffs == [0.0] * 20, diffs
    fell_back = [s for s in rep if s.mode == "eager" and s.reason != "eager by design"]
    # FP4 on the emulated backend reads global scales / offsets on the host: those segments say so
    assert fell_back and all(s.reason.startswith("capture failed") for s in fell_back)
    # each for its own host read: a failed capture's pool is not reused (it failed the next ones, H100)
    assert not any("beginAllocateToPool" in s.reason for s in fell_back), [s.reason for s in fell_back]


def test_emulated_all_bf16_captures_what_has_no_host_read() -> None:
    model = dsv4.load_model("tiny", plan="all-bf16", backend="emulated", device="cuda:0")
    dec = GraphDecoder(model)
    diffs = _side_by_side(model, dec, steps=20)
    modes = _modes(dec)
    _log("emulated_all_bf16", diffs=diffs, segments=[s.__dict__ for s in dec.report()])
    assert diffs == [0.0] * 20, diffs
    # the dense BF16 projections capture; the grouped BF16 GEMMs loop over offsets.tolist() (host read)
    assert all(modes[f"L{i}.attn_pre"] == "graph" for i in range(model.config.num_hidden_layers)), modes
    assert modes["L0.attn_out"] == "eager" and modes["head"] == "graph"


def test_a_failed_capture_leaves_the_cuda_generator_usable():
    """A capture refused by a host read leaves the default CUDA generator in capture mode unless
    ``capture`` ends that with an empty capture: later ``torch.randn(device='cuda')`` raised "Offset
    increment outside graph capture encountered unexpectedly" (an H200 run, after the emulated
    backend's fallbacks, broke the next test that drew random numbers on the GPU)."""
    from dsv4.decode.graphs import capture

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    x = torch.ones(4, device="cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        err = capture(torch.cuda.CUDAGraph(), None, lambda: float(x.sum()))   # a host read: refused
    assert err is not None
    assert torch.randn(8, device="cuda").isfinite().all()

