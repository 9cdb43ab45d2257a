"""``python -m dsv4.decode.readiness``: what keeps the native decode step out of a CUDA graph, and where.

On a CUDA device it runs the native model's ``decode_step`` and lists every violation with the line of
``dsv4/`` code responsible (the innermost frame inside the package):

1. **host syncs** — one step under ``torch.cuda.set_sync_debug_mode("warn")``; every "synchronizing
   CUDA operation" warning is recorded with the Python stack at that moment (:class:`SyncRecorder`);
2. **step-to-step differences** — op traces of consecutive steps (:mod:`dsv4.decode.optrace`): output
   shapes that change (allocations whose size depends on the position), Python scalars that change
   (values a graph would bake in), data-dependent ops, pageable host copies, position-dependent
   control flow;
3. **a whole-step capture attempt** — where it fails;
4. **the piecewise decoder** (:class:`dsv4.decode.graphs.GraphDecoder`, ``verify=True``): which
   segments are captured and replay exactly, and why any fell back to eager.

Exit codes: 0 every capturable segment of the piecewise decoder runs as a graph, 1 some fell back,
2 bad input or no CUDA device (the checks need one; their pure logic is unit-tested on the CPU).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..checkpoint.builtin import add_checkpoint_argument

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from .optrace import Finding


from .where import PACKAGE_ROOT, Location, exception_location, first_line, package_frames, source_location

EXIT_READY, EXIT_NOT_READY, EXIT_BAD_INPUT = 0, 1, 2
SYNC_PATTERN = "synchronizing cuda operation"


class ReadinessInputError(ValueError):
    """The readiness check cannot run as asked (no CUDA device, bad arguments)."""


@dataclass(frozen=True)
class SyncEvent:
    message: str
    location: Location | None
    chain: tuple[Location, ...]          # every dsv4 frame, outermost first

    @property
    def where(self) -> str:
        return str(self.location) if self.location else "<outside dsv4>"


class SyncRecorder:
    """``with SyncRecorder() as r: ...`` -> ``r.events``: one :class:`SyncEvent` per warning whose text
    matches ``pattern`` (torch's sync-debug warning by default), with the stack at warning time.
    ``mode`` sets ``torch.cuda.set_sync_debug_mode`` inside (None: leave it alone, e.g. on the CPU or
    when a test issues the warnings itself)."""

    def __init__(self, pattern: str = SYNC_PATTERN, mode: str | None = "warn", root: Path = PACKAGE_ROOT) -> None:
        self.pattern, self.mode, self.root = pattern.lower(), mode, root
        self.events: list[SyncEvent] = []
        self._prev_mode: int | None = None

    def _show(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
              line: Any = None) -> None:
        text = str(message)
        if self.pattern not in text.lower():
            return self._passthrough(message, category, filename, lineno, file, line)
        stack = traceback.extract_stack()[:-1]
        self.events.append(SyncEvent(text.strip().splitlines()[0], source_location(stack, self.root),
                                     tuple(package_frames(stack, self.root))))

    def __enter__(self) -> "SyncRecorder":
        import torch

        self._cw = warnings.catch_warnings()
        self._cw.__enter__()
        warnings.simplefilter("always")
        self._passthrough = warnings.showwarning
        warnings.showwarning = self._show
        if self.mode is not None:
            self._prev_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.mode is not None and self._prev_mode is not None:
            torch.cuda.set_sync_debug_mode(self._prev_mode)
        self._cw.__exit__(*exc)


def group_syncs(events: Sequence[SyncEvent]) -> list[tuple[str, int, str]]:
    """(location, count, the dsv4 call chain of the first event there), most frequent first."""
    counts: dict[str, int] = {}
    chain: dict[str, str] = {}
    for e in events:
        counts[e.where] = counts.get(e.where, 0) + 1
        chain.setdefault(e.where, " <- ".join(f"{c.path.rsplit('/', 1)[-1]}:{c.line}" for c in reversed(e.chain[:-1])))
    return sorted(((w, n, chain[w]) for w, n in counts.items()), key=lambda x: (-x[1], x[0]))


@dataclass
class CaptureAttempt:
    ok: bool
    error: str = ""
    location: str = ""


@dataclass
class Report:
    config: str
    plan: str
    backend: str
    device: str
    syncs: list[tuple[str, int, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    capture: CaptureAttempt | None = None
    segments: list[dict[str, Any]] = field(default_factory=list)
    graph_matches_eager: bool | None = None
    mismatch: str = ""

    @property
    def fallbacks(self) -> list[dict[str, Any]]:
        """Segments that could be graphs but run eagerly."""
        return [s for s in self.segments if s["mode"] == "eager" and s["reason"] != "eager by design"]

    @property
    def ready(self) -> bool:
        return bool(self.segments) and not self.fallbacks and self.graph_matches_eager is not False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["findings"] = [asdict(f) for f in self.findings]
        d["ready"], d["fallbacks"] = self.ready, len(self.fallbacks)
        return d


# ---- the checks (CUDA) ------------------------------------------------------------------------
def attempt_capture(model: Any, state: Any, token: int, device: torch.device, runtime: Any) -> CaptureAttempt:
    """Capture one whole ``decode_step`` on a side stream (on a copy of ``state``)."""
    import torch

    from .graphs import capture

    st = copy.deepcopy(state)
    with runtime.on_device(device), runtime.on_stream(runtime.new_stream(device)), torch.no_grad():
        err = capture(runtime.graph(), None, lambda: model.decode_step(st, token))
    if err is None:
        return CaptureAttempt(True)
    where = exception_location(err)   # the first violation aborts the capture: that is the finding
    return CaptureAttempt(False, first_line(err), str(where) if where else "<outside dsv4>")


def check(model: Any, prompt: torch.Tensor, *, trace_steps_n: int, streams: int, runtime: Any = None,
          sync_mode: str | None = "warn") -> Report:
    """Every check of the module doc. ``runtime`` / ``sync_mode``: a fake CUDA runtime and no sync
    debug mode let the CPU tests drive this same code."""
    import torch
    from .optrace import diff_many, trace_steps

    from .graphs import CudaRuntime, GraphDecoder, GraphMismatchError, bitwise_equal

    rt = runtime or CudaRuntime()
    dev = rt.device(next(iter(model.device_map.values())))
    rep = Report(model.config.name, model.plan.name, ",".join(sorted(set(model.backend_names().values()))), str(dev))
    with torch.no_grad(), rt.on_device(dev):
        logits, state = model.prefill(prompt)
        tok = int(logits[-1].argmax())
        for _ in range(2):                               # compile every decode-shaped kernel first
            tok = int(model.decode_step(state, tok).argmax())
        probe_state = copy.deepcopy(state)
        with SyncRecorder(mode=sync_mode) as rec:
            model.decode_step(probe_state, tok)
        rep.syncs = group_syncs(rec.events)
        on_cuda = dev.type == "cuda"
        rep.findings = diff_many(trace_steps(model, copy.deepcopy(state), [tok] * trace_steps_n, device_only=on_cuda))
        rep.capture = attempt_capture(model, state, tok, dev, rt)
        dec = GraphDecoder(model, streams_per_device=streams, verify=True, runtime=rt)
        eager_state, graph_state = copy.deepcopy(state), copy.deepcopy(state)
        same = True
        try:
            for _ in range(3):                           # warm-up, capture, one verified replay
                a = model.decode_step(eager_state, tok)
                b = dec.step(graph_state, tok)
                same &= bitwise_equal(a, b)
                tok = int(a.argmax())
        except GraphMismatchError as e:                  # a replay that differs from eager is the finding
            rep.mismatch, same = str(e), False
        rep.graph_matches_eager = same
        rep.segments = [asdict(s) for s in dec.report()]
    return rep


# ---- rendering (pure) -------------------------------------------------------------------------
KIND_TEXT = {"data_dependent": "data-dependent op / host read", "host_copy": "host -> device copy",
             "step_shape": "allocation size changes with the position",
             "step_scalar": "position-dependent scalar baked in",
             "control_flow": "runs only at some positions"}


def render(console: Console, rep: Report, *, per_kind: int = 12) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    console.print(Text(f"CUDA-graph readiness: {rep.config}, plan {rep.plan}, backend {rep.backend}, {rep.device}",
                       style="bold"))
    t = Table(title="host syncs in one decode_step (sync debug mode 'warn')", title_justify="left")
    for c in ("location", "count", "called from"):
        t.add_column(c)
    for where, n, chain in rep.syncs:
        t.add_row(escape(where), str(n), escape(chain))
    console.print(t if rep.syncs else Text("host syncs: none", style="green"))
    t = Table(title="step-to-step differences (op traces of consecutive steps)", title_justify="left")
    for c in ("kind", "location", "ops", "example", "count"):
        t.add_column(c)
    for kind in KIND_TEXT:
        rows = [f for f in rep.findings if f.kind == kind]
        for f in rows[:per_kind]:
            t.add_row(KIND_TEXT[kind], escape(f.location), escape(f.op), escape(f.detail[:60]), str(f.count))
        if len(rows) > per_kind:
            t.add_row(KIND_TEXT[kind], f"... {len(rows) - per_kind} more (--json)", "", "", "")
    console.print(t)
    if rep.capture is not None:
        c = rep.capture
        console.print(Text("whole-step capture: ok", style="green") if c.ok else
                      Text(f"whole-step capture: fails at {c.location}: {c.error}", style="yellow"))
    t = Table(title="piecewise CUDA-graph decoder (GraphDecoder, verify=True)", title_justify="left")
    for c in ("segment", "device", "stream", "mode", "reason"):
        t.add_column(c)
    for s in rep.segments:
        style = "green" if s["mode"] == "graph" else ("dim" if s["reason"] == "eager by design" else "red")
        t.add_row(escape(s["name"]), s["device"], str(s["stream"]), s["mode"], escape(s["reason"]), style=style)
    console.print(t)
    if rep.graph_matches_eager is not None:
        console.print(Text("graph logits == eager logits (bitwise): " + ("yes" if rep.graph_matches_eager else "NO"),
                           style="green" if rep.graph_matches_eager else "bold red"))
    if rep.mismatch:
        console.print(Text(rep.mismatch, style="bold red"))
    console.print(Text("READY" if rep.ready else f"NOT READY: {len(rep.fallbacks)} capturable segment(s) run eagerly",
                       style="bold green" if rep.ready else "bold red"))


# ---- CLI --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dsv4.decode.readiness", description=__doc__.split("\n\n")[0])
    add_checkpoint_argument(p)
    p.add_argument("--plan", default="default", help="plan preset or TOML file")
    p.add_argument("--backend", default="auto", help="kernel backend (default auto: cutedsl_sm90 on Hopper)")
    p.add_argument("--device", default="cuda", help="a CUDA device, e.g. cuda:1 (default cuda)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="length of the synthetic prompt")
    p.add_argument("--trace-steps", type=int, default=None,
                   help="consecutive decode steps traced (default csa_ratio + 1: one CSA block closes)")
    p.add_argument("--streams", type=int, default=1, help="streams per device for the piecewise decoder")
    p.add_argument("--json", default=None, help="write the report as JSON here")
    return p


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    from rich.console import Console
    from rich.text import Text

    from ..kernels.registry import BackendError

    console = console or Console()
    try:
        dev = torch.device(args.device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise ReadinessInputError(
                f"--device {args.device}: the readiness check needs a CUDA device (it watches CUDA syncs and "
                f"attempts CUDA-graph captures), found "
                f"{'no CUDA device on this machine' if not torch.cuda.is_available() else dev.type}")
        if (dev.index or 0) >= torch.cuda.device_count():
            raise ReadinessInputError(f"--device {args.device}: this machine has {torch.cuda.device_count()} "
                                      f"CUDA device(s)")
        if args.prompt_tokens < 1 or args.streams < 1:
            raise ReadinessInputError("--prompt-tokens and --streams: expected >= 1")
        import dsv4

        model = dsv4.load_model(args.checkpoint, plan=args.plan, backend=args.backend, device=str(dev))
    except (ReadinessInputError, ValueError, BackendError) as e:   # ValueError: plan/config/checkpoint errors
        console.print(Text(f"error: {e}", style="bold red"))
        return EXIT_BAD_INPUT
    c = model.config
    prompt = (torch.arange(args.prompt_tokens, dtype=torch.int64) * 7 + 3) % c.vocab_size
    rep = check(model, prompt, trace_steps_n=args.trace_steps or c.csa_ratio + 1, streams=args.streams)
    render(console, rep)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep.to_dict(), f, indent=2, default=str)
    return EXIT_READY if rep.ready else EXIT_NOT_READY


if __name__ == "__main__":
    sys.exit(main())
