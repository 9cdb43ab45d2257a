"""The CUDA-graph decoder's control flow on the CPU, with a fake CUDA runtime whose "graphs" behave
like CUDA graphs: capture records every ATen op (refusing host reads and data-dependent sizes, as a
capturing CUDA stream does), replay re-runs the recorded ops on the recorded tensors with the recorded
Python scalars. So a replay reads the addresses captured and bakes the scalars captured — the two ways
a real graph goes stale — and the decoder must still equal ``decode_step`` bit for bit. The real
thing runs on the H200 in test_decode_graphs.py."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import dsv4
from dsv4.decode import pieces as pieces_mod
from dsv4.decode.graphs import CudaRuntime, GraphDecoder, GraphMismatchError, bitwise_equal
from dsv4.decode.pieces import GraphDecoderError

PROMPT = (torch.arange(40, dtype=torch.int64) * 11 + 2) % 512
# what a capturing CUDA stream refuses: host reads of device values, data-dependent output sizes
REFUSED = {"aten._local_scalar_dense", "aten.nonzero", "aten.bincount", "aten.masked_select", "aten.unique"}


class CaptureRefused(RuntimeError):
    pass


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if str(func.overloadpacket) in REFUSED:
            raise CaptureRefused(f"operation not permitted when stream is capturing ({func})")
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


class FakeGraph:
    def __init__(self) -> None:
        self.ops: list = []
        self._mode: _Recorder | None = None
        self._tolist: Any = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self._mode = _Recorder(self.ops)
        self._mode.__enter__()
        self._tolist = torch.Tensor.tolist          # tolist reads memory without an ATen op: refuse it too

        def refused(t: torch.Tensor) -> Any:
            raise CaptureRefused("operation not permitted when stream is capturing (tolist)")

        torch.Tensor.tolist = refused

    def capture_end(self) -> None:
        torch.Tensor.tolist = self._tolist
        self._mode.__exit__(None, None, None)

    def replay(self) -> None:
        for func, args, kwargs, out in self.ops:
            new = func(*args, **kwargs)
            for o, n in zip(tree_flatten(out)[0], tree_flatten(new)[0]):
                if isinstance(o, torch.Tensor) and o is not n:
                    o.copy_(n)


class FakeStream:
    def __init__(self, device: torch.device, name: str, log: list) -> None:
        self.device, self.name, self.log = device, name, log

    def wait_stream(self, other: "FakeStream") -> None:
        self.log.append((self.name, other.name))


class FakeRuntime(CudaRuntime):
    def __init__(self) -> None:
        self.waits: list = []
        self.streams: list[FakeStream] = []
        self.graphs: list[FakeGraph] = []
        self.caller = FakeStream(torch.device("cpu"), "caller", self.waits)

    def available(self) -> bool:
        return True

    def device(self, d: Any) -> torch.device:
        return torch.device(d)

    def accepts(self, d: torch.device) -> bool:
        return d.type == "cpu"

    def new_stream(self, d: torch.device) -> FakeStream:
        self.streams.append(FakeStream(d, f"s{len(self.streams)}", self.waits))
        return self.streams[-1]

    def current_stream(self, d: torch.device) -> FakeStream:
        return self.caller

    def on_device(self, d: torch.device) -> Any:
        return nullcontext()

    def on_stream(self, s: Any) -> Any:
        return nullcontext()

    def graph(self) -> FakeGraph:
        self.graphs.append(FakeGraph())
        return self.graphs[-1]

    def pool(self) -> object:
        return object()


def _model(plan: str) -> Any:
    torch.set_num_threads(1)
    return dsv4.load_model("tiny", plan=plan, backend="emulated")


def _side_by_side(model: Any, dec: GraphDecoder, steps: int) -> list[bool]:
    same = []
    with torch.no_grad():
        le, se = model.prefill(PROMPT)
        _, sg = model.prefill(PROMPT)
        tok = int(le[-1].argmax())
        for _ in range(steps):
            a = model.decode_step(se, tok)
            same.append(bitwise_equal(a, dec.step(sg, tok)))
            tok = int(a.argmax())
    return same


def _modes(dec: GraphDecoder) -> dict[str, str]:
    return {s.name: s.mode for s in dec.report()}


@pytest.fixture(scope="module")
def bf16() -> Any:
    return _model("all-bf16")


def test_replay_equals_decode_step_and_host_reading_pieces_fall_back(bf16: Any) -> None:
    dec = GraphDecoder(bf16, runtime=FakeRuntime(), verify=True)
    # 24 steps after a 40-token prompt: the window wraps, CSA and HCA blocks close inside graphs' steps
    assert _side_by_side(bf16, dec, 24) == [True] * 24
    modes = _modes(dec)
    # dense BF16 projections capture; the grouped BF16 GEMMs loop over offsets.tolist() (a host read)
    for i in range(4):
        assert modes[f"L{i}.attn_pre"] == "graph" and modes[f"L{i}.attn_out"] == "eager"
        assert modes[f"L{i}.ffn"] == "eager"       # split off its neighbour: the next attn_pre still captures
    assert modes["head"] == "graph" and modes["embed"] == "eager"
    why = {s.name: s.reason for s in dec.report()}
    assert why["L0.attn_out"].startswith("capture failed: CaptureRefused") and "tolist" in why["L0.attn_out"]
    assert "dsv4/layers/grouped_linear.py" in why["L0.attn_out"]      # where the host read is
    assert why["L0.attn_core"] == "eager by design"


def test_fp4_on_the_emulated_backend_falls_back_with_its_host_read_named() -> None:
    m = _model("default")
    dec = GraphDecoder(m, runtime=FakeRuntime())
    assert _side_by_side(m, dec, 6) == [True] * 6
    rep = {s.name: s for s in dec.report()}
    # the emulated quantizer reads nothing back on its own (its codes need no range check), so the
    # projections before attention capture; the grouped experts' offsets check is a host read
    assert rep["L0.attn_pre"].mode == "graph"
    assert rep["L0.attn_out"].mode == "eager" and "_local_scalar_dense" in rep["L0.attn_out"].reason
    assert "dsv4/kernels/contract.py" in rep["L0.attn_out"].reason
    assert rep["head"].mode == "graph"                # the BF16 head has no host read
    with pytest.raises(GraphDecoderError, match="segment L0.attn_out: capture failed"):
        _side_by_side(m, GraphDecoder(m, runtime=FakeRuntime(), strict=True), 3)



def test_a_failed_capture_leaves_its_pool_behind(bf16: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No capture after a failed one goes into the failed one's memory pool: torch can leave the allocator
    recording into it, and every later capture into that pool then fails on its own account (H100)."""
    from dsv4.decode import graphs

    log: list = []
    real = graphs.capture

    def logged(g: Any, pool: Any, fn: Any) -> Any:
        err = real(g, pool, fn)
        log.append((pool, err is not None))
        return err

    monkeypatch.setattr(graphs, "capture", logged)
    dec = GraphDecoder(bf16, runtime=FakeRuntime(), verify=True)
    assert _side_by_side(bf16, dec, 4) == [True] * 4
    failed = [i for i, (_, bad) in enumerate(log) if bad]
    assert failed and any(not bad for _, bad in log[failed[0]:])      # captures fail, later ones still succeed
    for i in failed:
        assert all(pool is not log[i][0] for pool, _ in log[i + 1:]), f"capture {i}'s pool reused after it failed"


def test_a_baked_position_is_caught_by_verified_replay(bf16: Any) -> None:
    dec = GraphDecoder(bf16, runtime=FakeRuntime(), verify=True)
    piece = next(p for p in dec.pieces if p.name == "L0.attn_pre")
    run = piece.run

    def baked() -> dict:
        out = run()
        out["L0.q"] = out["L0.q"] + torch.full_like(out["L0.q"], float(dec.cur.start)) * 1e-2
        return out

    piece.run = baked
    with pytest.raises(GraphMismatchError, match="L0.attn_pre"):
        _side_by_side(bf16, dec, 4)


def test_rebinding_a_buffer_instead_of_copying_into_it_goes_stale(bf16: Any, monkeypatch) -> None:
    """Why ``Buffers.put`` copies in place: graphs read the addresses they captured. A put that rebinds
    leaves every replay reading the capture step's input — the fake shows it as a wrong logit."""
    def rebind(self: Any, name: str, value: torch.Tensor) -> None:
        (self.overlay if self.overlay is not None else self.t)[name] = value.detach().clone()

    monkeypatch.setattr(pieces_mod.Buffers, "put", rebind)
    dec = GraphDecoder(bf16, runtime=FakeRuntime())
    same = _side_by_side(bf16, dec, 5)
    assert same[:2] == [True, True] and not all(same[2:])


def test_two_streams_split_the_layers_and_chain_every_hand_off(bf16: Any) -> None:
    rt = FakeRuntime()
    dec = GraphDecoder(bf16, runtime=rt, streams_per_device=2)
    assert _side_by_side(bf16, dec, 4) == [True] * 4
    by_piece = {p: s.stream for s in dec.report() for p in s.pieces}
    assert {by_piece[f"L{i}.attn_pre"] for i in (0, 1)} == {0} and {by_piece[f"L{i}.attn_pre"] for i in (2, 3)} == {1}
    assert by_piece["embed"] == 0 and by_piece["head"] == 1
    # per step: the first stream waits on the caller, 0 -> 1 once, and the caller waits on the last
    step_waits = rt.waits[:len(rt.waits) // 4]
    assert step_waits == [("s0", "caller"), ("s1", "s0"), ("caller", "s1")]


def test_without_capture_every_piece_runs_eagerly_and_exactly(bf16: Any) -> None:
    rt = FakeRuntime()
    dec = GraphDecoder(bf16, runtime=rt, capture=False)
    assert _side_by_side(bf16, dec, 3) == [True] * 3
    assert rt.graphs == [] and {s.mode for s in dec.report()} == {"eager"}


def test_arguments_are_checked() -> None:
    m = _model("all-bf16")
    with pytest.raises(GraphDecoderError, match="warmup >= 1"):
        GraphDecoder(m, runtime=FakeRuntime(), warmup=0)
    with pytest.raises(GraphDecoderError, match="expected the model's device"):
        GraphDecoder(m, runtime=FakeRuntime(), device="cpu:0")
    dec = GraphDecoder(m, runtime=FakeRuntime())
    from dsv4 import probes
    with torch.no_grad():
        _, st = m.prefill(PROMPT)
        with probes.ProbeRecorder(), pytest.raises(GraphDecoderError, match="probes"):
            dec.step(st, 3)


def test_a_failed_capture_is_followed_by_an_empty_one_and_a_clean_one_is_not():
    """``capture`` ends the generator's capture mode after a failure with one empty capture (a torch
    CUDA generator stays in it otherwise; the GPU test checks the generator itself)."""
    from dsv4.decode.graphs import capture

    log: list = []

    class Noting:
        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
            log.append((id(self), "begin"))

        def capture_end(self) -> None:
            log.append((id(self), "end"))

    g = Noting()
    assert capture(g, None, lambda: None) is None and len(log) == 2

    def refused() -> None:
        raise CaptureRefused("operation not permitted when stream is capturing")

    log.clear()
    assert isinstance(capture(g, None, refused), CaptureRefused)
    assert [e for _, e in log] == ["begin", "end", "begin", "end"] and log[2][0] != id(g)


class _FakeGen:
    """A generator whose state is 'stuck in capture mode' until a fresh state is swapped in."""

    def __init__(self, stuck: bool) -> None:
        self.stuck, self.seed, self.offset = stuck, 1234, 40

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, o: int) -> None:
        self.offset = o

    def initial_seed(self) -> int:
        return self.seed

    def manual_seed(self, s: int) -> None:
        self.seed = s

    def graphsafe_get_state(self) -> "_FakeGen":
        return self

    def graphsafe_set_state(self, other: "_FakeGen") -> None:
        self.stuck, self.seed = other.stuck, other.seed

    def draw(self) -> None:
        if self.stuck:
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")
        self.offset += 4


@pytest.mark.parametrize("stuck", [True, False])
def test_restore_default_generator_swaps_a_stuck_state_and_keeps_seed_and_offset(stuck: bool) -> None:
    from dsv4.decode.graphs import restore_default_generator

    g = _FakeGen(stuck)
    assert restore_default_generator(g, g.draw, lambda: _FakeGen(False)) is stuck
    assert (g.stuck, g.seed, g.offset) == (False, 1234, 40)   # usable, same seed, the probe's draw undone
    g.draw()                                                   # and it draws


def test_restore_default_generator_lets_other_errors_through() -> None:
    from dsv4.decode.graphs import restore_default_generator

    g = _FakeGen(False)

    def broken() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        restore_default_generator(g, broken, lambda: _FakeGen(False))
