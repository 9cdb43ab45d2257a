"""The CUDA-graph decoder: ``GraphDecoder(model).step(state, token)`` is a drop-in for the native
model's ``decode_step`` that replays CUDA graphs for the capturable pieces of a step
(:mod:`dsv4.decode.pieces`) and runs the rest (attention core, embedding) eagerly.

Streams and devices. Every segment runs on an explicit ``torch.cuda.Stream(device=...)`` of its
device, inside ``torch.cuda.device(...)``: it is captured on that stream (``capture_begin`` with a
memory pool per stream) and replayed on it. Defaults are what this guards against:
``torch.cuda.graph`` without ``stream=`` captures on a class-level side stream created on whichever
device was current first; a model on ``cuda:1`` then launches its kernels on its own device's
current stream, outside the capture, and the graph replays nothing: zeros or stale data. Consecutive segments
on different streams are chained with ``wait_stream``: a step is one ordered chain (caller stream ->
input fills -> segments -> caller stream), so caches and buffers are never touched by two streams at
once. ``streams_per_device=2`` splits each device's layers over two streams: a two-"device" pipeline
on one GPU that exercises the hand-offs a multi-GPU ``device_map`` needs (real cross-device
transfers run as eager pieces with both devices' streams current).

Steps. The first ``warmup`` steps run every piece eagerly on the decoder's streams (kernels compile,
persistent backend buffers such as split-K counters reach their size before anything captures their
address). The next step captures each run of consecutive capturable pieces: an eager reference run,
the capture, one replay, and a bitwise comparison of the two. A segment whose capture fails (a host
read: the emulated backend reads offsets and global scales on the host) or whose replay differs stays
eager, with the reason in :meth:`GraphDecoder.report` (``strict=True`` raises instead). With
``verify=True`` every later step re-runs each captured segment eagerly and compares bit for bit.

Exactness: a replay launches the same kernels on the same inputs, so the logits equal
``decode_step``'s bit for bit as long as the kernels are deterministic (the sm_90 GEMMs reduce
split-K partials in a fixed order). Probes are not emitted by graphs: recording probes needs the
eager ``decode_step``. The model's kernel log counts a captured GEMM once, not once per replay.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch

from .. import probes
from .pieces import Buffers, GraphDecoderError, Piece, StepInput, advance, build_pieces, finish, static_inputs
from .where import exception_location, first_line


class GraphMismatchError(GraphDecoderError):
    """A replayed graph's outputs differ from an eager run of the same pieces on the same inputs."""


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN payloads included; -0.0 != 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(torch.equal(a.contiguous().view(ints), b.contiguous().view(ints)))
    return bool(torch.equal(a, b))


class CudaRuntime:
    """Every CUDA call the decoder makes, in one place: the CPU tests of the decoder's control flow
    swap in a fake that records and replays ops (tests/dsv4/test_decode_graphs_logic.py)."""

    def available(self) -> bool:
        return torch.cuda.is_available()

    def device(self, d: Any) -> torch.device:
        d = torch.device(d)
        return torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d

    def accepts(self, d: torch.device) -> bool:
        return d.type == "cuda"

    def new_stream(self, d: torch.device) -> Any:
        return torch.cuda.Stream(device=d)

    def current_stream(self, d: torch.device) -> Any:
        return torch.cuda.current_stream(d)

    def on_device(self, d: torch.device) -> Any:
        return torch.cuda.device(d)

    def on_stream(self, s: Any) -> Any:
        return torch.cuda.stream(s)

    def graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    def pool(self) -> Any:
        return torch.cuda.graph_pool_handle()


def capture(g: Any, pool: Any, fn: Any) -> BaseException | None:
    """Capture ``fn()`` into ``g`` on the current stream; returns the FIRST error, or None. (A failed
    capture also fails ``capture_end`` with "invalidated": that one must not hide the cause.)"""
    try:
        g.capture_begin(pool=pool, capture_error_mode="thread_local")
    except Exception as e:   # the generator may be in capture mode already; the pool is left alone
        _end_generator_capture(type(g))
        return e
    err: BaseException | None = None
    try:
        fn()
    except Exception as e:   # a host sync, a pageable copy, a kernel refusing capture...
        err = e
    try:
        g.capture_end()
    except Exception as e:
        err = err or e
    if err is not None:
        _end_generator_capture(type(g))
    return err


def _end_generator_capture(graph_cls: Any) -> None:
    """After a failed capture, one empty capture on the same stream. ``capture_begin`` puts the
    device's default CUDA generator in capture mode and only a successful ``capture_end`` takes it out
    (torch 2.11): left so, every later CUDA RNG call in the process raises "Offset increment outside
    graph capture encountered unexpectedly" (seen on an H200 after the emulated backend's fallbacks).
    Where the empty capture cannot end it either, :func:`restore_default_generator` swaps the state."""
    import warnings

    h = graph_cls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "The CUDA Graph is empty": it is meant to be
        try:
            h.capture_begin(capture_error_mode="thread_local")
            h.capture_end()
        except Exception:   # restore_default_generator below repairs what this could not
            pass
    if graph_cls is torch.cuda.CUDAGraph:
        restore_default_generator()


STUCK_GENERATOR = "Offset increment outside graph capture"


def restore_default_generator(gen: Any = None, draw: Any = None, fresh: Any = None) -> bool:
    """Make the current device's default CUDA generator usable again if a failed capture left its
    state in capture mode; True when it had to. Its seed and offset are kept: one draw tests it (the
    offset is put back afterwards) and a stuck state is replaced by a fresh one holding the same seed
    and offset (``graphsafe_set_state``). ``gen`` / ``draw`` / ``fresh``: fakes for the CPU tests."""
    if gen is None:
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return False
        gen = torch.cuda.default_generators[torch.cuda.current_device()]
        draw = draw or (lambda: torch.empty(1, device=gen.device).uniform_(generator=gen))
        fresh = fresh or (lambda: torch.Generator(device=gen.device))
    offset = gen.get_offset()
    try:
        draw()
        stuck = False
    except RuntimeError as e:
        if STUCK_GENERATOR not in str(e):
            raise
        stuck = True
        new = fresh()
        new.manual_seed(gen.initial_seed())
        gen.graphsafe_set_state(new.graphsafe_get_state())
    gen.set_offset(offset)
    return stuck


@dataclass
class Segment:
    pieces: list[Piece]
    device: torch.device
    stream: Any                      # torch.cuda.Stream
    stream_index: int
    graphable: bool
    src_stream: Any = None           # a transfer: the producing device's stream
    mode: str = "pending"            # pending -> graph | eager
    reason: str = ""
    graph: Any = None

    @property
    def name(self) -> str:
        return self.pieces[0].name if len(self.pieces) == 1 else f"{self.pieces[0].name}..{self.pieces[-1].name}"


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    pieces: tuple[str, ...]
    device: str
    stream: int
    mode: str
    reason: str


class GraphDecoder:
    def __init__(self, model: Any, *, device: str | None = None, streams_per_device: int = 1, warmup: int = 1,
                 capture: bool = True, verify: bool = False, strict: bool = False,
                 runtime: CudaRuntime | None = None) -> None:
        from ..streamed import is_streamed

        if is_streamed(model):
            raise GraphDecoderError("CUDA-graph decoding: expected a model whose layers stay built, found a streamed "
                                    "one (dsv4.streamed: a replay would read a dropped layer's freed weights); use "
                                    "model.decode_step")
        rt = self.rt = runtime or CudaRuntime()
        if not rt.available():
            raise GraphDecoderError("CUDA-graph decoding: expected a CUDA device, found none (torch.cuda is "
                                    "unavailable); use model.decode_step")
        keys = list(model.device_map)
        devs = {k: rt.device(model.device_map[k]) for k in keys}
        if not all(rt.accepts(d) for d in devs.values()):
            raise GraphDecoderError(f"CUDA-graph decoding: expected every module on CUDA, found device map "
                                    f"{ {str(k): str(v) for k, v in devs.items()} }")
        if device is not None and {rt.device(device)} != set(devs.values()):
            raise GraphDecoderError(f"device: expected the model's device(s) {sorted(map(str, set(devs.values())))}, "
                                    f"found {device!r}")
        if streams_per_device < 1 or warmup < 1:
            # warm-up first: a persistent backend buffer grown while a later segment captures would leave
            # the graphs captured before it pointing at freed memory
            raise GraphDecoderError(f"streams_per_device >= 1 and warmup >= 1 expected, found {streams_per_device}, "
                                    f"{warmup}")
        self.model, self.warmup, self.capture, self.verify, self.strict = model, warmup, capture, verify, strict
        self.buf, self.cur = Buffers(), StepInput()
        self.pieces = build_pieces(model, self.buf, self.cur)
        self.devices = devs
        self.streams = self._make_streams(streams_per_device)
        self.segments = self._segments()
        self._pools: dict[int, Any] = {}
        self._names = {n: rt.device(d) for n, d in static_inputs(model, self.buf).items()}   # suffix -> device
        self.steps = 0

    # ---- construction ------------------------------------------------------------------------
    def _make_streams(self, k: int) -> dict[Any, tuple[Any, int]]:
        """device-map key -> (stream, index): each device's layers in ``k`` contiguous stream groups."""
        L = len(self.model.blocks)
        by_dev: dict[torch.device, list[int]] = {}
        for i in range(L):
            by_dev.setdefault(self.devices[i], []).append(i)
        made: dict[tuple[torch.device, int], Any] = {}
        index: dict[tuple[torch.device, int], int] = {}

        def stream(d: torch.device, g: int) -> tuple[Any, int]:
            if (d, g) not in made:
                made[(d, g)] = self.rt.new_stream(d)
                index[(d, g)] = len(index)
            return made[(d, g)], index[(d, g)]

        out: dict[Any, tuple[Any, int]] = {}
        for d, layers in by_dev.items():
            for n, i in enumerate(layers):
                out[i] = stream(d, n * k // len(layers))
        out["embed"] = stream(self.devices["embed"], 0)
        head_groups = k - 1 if self.devices["head"] in by_dev else 0
        out["head"] = stream(self.devices["head"], head_groups)
        return out

    def _segments(self) -> list[Segment]:
        segs: list[Segment] = []
        for p in self.pieces:
            s, idx = self.streams[p.key]
            graphable = p.graphable and self.capture
            last = segs[-1] if segs else None
            if (last is not None and last.stream is s and last.graphable == graphable and p.src_key is None
                    and last.src_stream is None):
                last.pieces.append(p)
                continue
            src = self.streams[p.src_key][0] if p.src_key is not None else None
            segs.append(Segment([p], self.devices[p.key], s, idx, graphable, src,
                                mode="pending" if graphable else "eager"))
        return segs

    # ---- the step ----------------------------------------------------------------------------
    def step(self, state: Any, token_id: int) -> torch.Tensor:
        """``model.decode_step(state, token_id)`` through graphs; returns fp32 logits [V]."""
        m = self.model
        if probes.active():
            raise GraphDecoderError("probes are recorded by the eager decode_step only; the graphs do not emit "
                                    "them (use model.decode_step while a ProbeRecorder is active)")
        advance(m, state, token_id, self.cur)
        rt = self.rt
        first = self.devices["embed"]
        caller = rt.current_stream(first)
        prev = caller
        with torch.no_grad():
            for name, d in self._names.items():     # the step's inputs, first links of the chain
                s = self.streams["embed"][0] if d == first else self._first_stream(d)
                if s is not prev:
                    s.wait_stream(prev)
                with rt.on_device(d), rt.on_stream(s):
                    self.buf.t[f"tok@{name}"].fill_(int(state.token_ids[-1]))
                    self.buf.t[f"pos@{name}"].fill_(self.cur.start)
                prev = s
            phase = "eager" if self.steps < self.warmup else "run"
            for seg in list(self.segments):          # a failed capture may split a segment in place
                if seg.stream is not prev:
                    seg.stream.wait_stream(prev)
                    prev = seg.stream
                self._run(seg, phase)
            head = self.devices["head"]
            out_stream = rt.current_stream(head)
            out_stream.wait_stream(prev)
            if caller is not out_stream:
                caller.wait_stream(prev)
            with rt.on_device(head), rt.on_stream(out_stream):
                logits = self.buf["logits"][0].clone()
        finish(state, self.cur)
        self.steps += 1
        return logits

    def _first_stream(self, d: torch.device) -> Any:
        return next(s for s, _ in self.streams.values() if s.device == d)

    def _run(self, seg: Segment, phase: str) -> None:
        with ExitStack() as stack:
            if seg.src_stream is not None:        # a cross-device copy orders against both devices' streams
                stack.enter_context(self.rt.on_stream(seg.src_stream))
            stack.enter_context(self.rt.on_device(seg.device))
            stack.enter_context(self.rt.on_stream(seg.stream))
            if seg.mode == "eager":
                self._eager(seg)
            elif phase == "eager":                 # warm-up of a capturable segment
                self._bind_run(seg)
            elif seg.mode == "pending":
                self._capture(seg)
            else:
                seg.graph.replay()
                if self.verify:
                    self._check(seg)

    def _bind_run(self, seg: Segment) -> None:
        """Run the pieces, binding their outputs (to the overlay while one is set)."""
        for p in seg.pieces:
            for n, v in p.run().items():
                self.buf.bind(n, v)

    def _eager(self, seg: Segment) -> None:
        for p in seg.pieces:
            for n, v in p.run().items():
                self.buf.put(n, v)

    def _overlay_run(self, seg: Segment) -> dict[str, torch.Tensor]:
        """Run the pieces eagerly without touching the stored buffers; returns their outputs."""
        self.buf.overlay = {}
        try:
            self._bind_run(seg)
            return self.buf.overlay
        finally:
            self.buf.overlay = None

    def _capture(self, seg: Segment) -> None:
        """Capture ``seg``; on failure split a multi-piece segment and capture its pieces one by one
        (one host-reading piece must not keep its neighbours out of graphs), else fall back to eager."""
        reason, mismatch = self._try_capture(seg)
        if reason is None:
            return
        if len(seg.pieces) > 1:
            subs = [Segment([p], seg.device, seg.stream, seg.stream_index, True) for p in seg.pieces]
            i = self.segments.index(seg)
            self.segments[i:i + 1] = subs
            for sub in subs:
                self._capture(sub)
            return
        if self.strict:
            raise (GraphMismatchError if mismatch else GraphDecoderError)(f"segment {seg.name}: {reason}")
        seg.mode, seg.reason = "eager", reason
        self._eager(seg)

    def _try_capture(self, seg: Segment) -> tuple[str | None, bool]:
        """(None, False) when captured and replayed equal to an eager run; else (reason, mismatch).
        On failure nothing is stored: the stored buffers only ever hold captured or eager outputs."""
        ref = self._overlay_run(seg)
        if seg.stream_index not in self._pools:
            self._pools[seg.stream_index] = self.rt.pool()
        pool = self._pools[seg.stream_index]
        g = self.rt.graph()
        self.buf.overlay = {}
        err = capture(g, pool, lambda: self._bind_run(seg))
        captured, self.buf.overlay = self.buf.overlay, None
        if err is not None:
            # A failed capture can leave the allocator recording into its pool (torch 2.11): every later
            # capture into that pool then fails in capture_begin ("beginAllocateToPool: already recording";
            # an H100 run of the emulated backend blamed that on every segment after the first refused one).
            self._pools[seg.stream_index] = self.rt.pool()
            where = exception_location(err)
            return f"capture failed: {first_line(err)}" + (f" at {where}" if where else ""), False
        g.replay()
        bad = [n for n in ref if not bitwise_equal(ref[n], captured[n])]
        if bad:
            return f"replay differs from eager in {bad}", True
        self.buf.t.update(captured)
        seg.graph, seg.mode = g, "graph"
        return None, False

    def _check(self, seg: Segment) -> None:
        ref = self._overlay_run(seg)
        bad = [n for n in ref if not bitwise_equal(ref[n], self.buf.t[n])]
        if bad:
            raise GraphMismatchError(f"step {self.steps}: segment {seg.name} replayed outputs {bad} that differ "
                                     f"from an eager run on the same inputs")

    # ---- introspection -----------------------------------------------------------------------
    @property
    def captured(self) -> bool:
        """Whether the capture step has run (every segment is then ``graph`` or ``eager``)."""
        return self.steps > self.warmup

    def report(self) -> list[SegmentInfo]:
        return [SegmentInfo(s.name, tuple(p.name for p in s.pieces), str(s.device), s.stream_index, s.mode,
                            s.reason or ("eager by design" if not any(p.graphable for p in s.pieces) else ""))
                for s in self.segments]
