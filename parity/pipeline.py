"""``torchrun --nproc-per-node N -m parity.pipeline``: one model's layers pipelined over the ranks.

For models too large for one device and users who will not stream weights from disk: rank r holds
a contiguous block of layers (parity/pipeline_plan.py: embedding on the first rank, head on the
last), the hidden stream X [T, hc_mult, D] goes rank to rank with ``torch.distributed`` send/recv
(gloo on CPU, nccl on CUDA), the logits are sent from the last rank to rank 0 and every rank's probes
are gathered there. The result is the one-process forward's, bit for bit (tests/parity/test_pipeline.py).

What each rank loads: the native model builds only the rank's parts (``dsv4.load_model(only=...)``);
the reference reads weights lazily, layer by layer, so a rank reads only the weights of the layers
it runs (every rank opens the checkpoint's index and headers). No layer needs another layer's
state: each layer's caches are its own, so only X crosses ranks (every rank's state object lists
every layer's caches; only its own layers' fill).

One door: :func:`pipelined_forward` (a first-token / prefill forward). Exit codes: 0 done, 2 bad
input (a bad layer plan names the plan expected and found), 3 the tool failed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .errors import ParityInputError
from .pipeline_plan import PipelinePlan, Stage, make_plan

SIDES = ("reference", "native")
# Dtypes the hidden stream / logits may travel in; the index is the wire code (bytes travel as uint8,
# so any dtype goes through gloo, and nothing is converted on the way).
_WIRE_DTYPES = ("bfloat16", "float32", "float16", "float64")
_HEADER = 8   # [dtype code, ndim, up to 6 dims]


@dataclass
class PipelineResult:
    """What :func:`pipelined_forward` returns on every rank. ``logits`` [T, V] fp32 are set on rank 0
    and the last rank; ``probes`` (name -> CPU tensor, execution order) on rank 0 only."""

    rank: int
    plan: PipelinePlan
    stage: Stage
    logits: Any = None
    probes: dict[str, Any] | None = None
    model: Any = None
    load_seconds: float = 0.0
    forward_seconds: float = 0.0
    timings: list[tuple[float, float]] = field(default_factory=list)   # rank 0: every rank's (load, forward)


class ModelLoader:
    """``loader(stage, device) -> model`` for one side; ``num_layers`` sizes the default plan.

    ``options`` go to ``reference.load_model`` (profile, dtype, cache_weights) or ``dsv4.load_model``
    (plan, backend, act_scale)."""

    def __init__(self, side: str, checkpoint: str, **options: Any) -> None:
        if side not in SIDES:
            raise ParityInputError(f"side: expected one of {SIDES}, found {side!r}")
        self.side, self.checkpoint, self.options = side, str(checkpoint), options
        self._layers: int | None = None

    @property
    def num_layers(self) -> int:
        if self._layers is None:
            from dsv4.checkpoint.reader import open_checkpoint
            from dsv4.model import resolve_checkpoint

            self._layers = open_checkpoint(resolve_checkpoint(self.checkpoint)).config.num_hidden_layers
        return self._layers

    def __call__(self, stage: Stage, device: str) -> Any:
        if self.side == "reference":
            import reference

            return reference.load_model(self.checkpoint, device=device, **self.options)   # lazy: nothing read yet
        import dsv4

        return dsv4.load_model(self.checkpoint, device=device, only=stage.parts, **self.options)


def pipelined_forward(model_loader: Callable[[Stage, str], Any], ids: Any, plan: Any = None, *,
                      device: str = "cpu", include: Any = None) -> PipelineResult:
    """The prefill logits of ``ids`` [T] with this launch's ranks each running its stage of ``plan``.

    ``model_loader(stage, device)`` builds this rank's model (a :class:`ModelLoader`, or any callable;
    with ``plan`` not a :class:`PipelinePlan` it needs a ``num_layers`` attribute). ``plan``: see
    parity/pipeline_plan.py (None: the even split over ``WORLD_SIZE`` ranks). ``include``: the probes
    to record (ProbeRecorder's predicate or regex; None records every probe, which rank 0 then holds in
    memory). Outside torchrun this is the one-process forward."""
    import torch

    from dsv4 import probes as probe_bus

    from . import distributed

    world, device = distributed.init(device)
    if isinstance(plan, PipelinePlan):
        pplan = plan
    else:
        n = getattr(model_loader, "num_layers", None)
        if not isinstance(n, int):
            raise ParityInputError(f"pipelined_forward: expected a PipelinePlan or a loader with num_layers, found "
                                   f"plan {plan!r} and loader {type(model_loader).__name__}")
        pplan = make_plan(n, world.size, plan)
    if pplan.size != world.size:
        raise ParityInputError(f"pipeline plan: expected {world.size} stage(s) (WORLD_SIZE), found {pplan.size}")
    stage = pplan.stages[world.rank]
    t0 = time.perf_counter()
    model = model_loader(stage, device)
    if model.config.num_hidden_layers != pplan.num_layers:
        raise ParityInputError(f"pipeline plan: expected a plan for the model's {model.config.num_hidden_layers} "
                               f"layers, found one for {pplan.num_layers}")
    t1 = time.perf_counter()
    last = pplan.size - 1
    logits = None
    with torch.no_grad(), probe_bus.ProbeRecorder(include=include, to_cpu=True) as rec:
        state = model.new_state(ids)      # every layer's empty caches; this rank fills its own
        X = model.embed(ids) if stage.embed else _recv(stage.rank - 1, device)
        for i in stage.layers:
            X = model.layer(i, X, state)
        if stage.head:
            logits = model.head(X)
        else:
            _send(X, stage.rank + 1)
    t2 = time.perf_counter()
    if last != 0:
        if world.rank == last:
            _send(logits, 0)
        elif world.main:
            logits = _recv(last, device)
    parts = distributed.gather(({n: rec.values[n] for n in rec.order}, (t1 - t0, t2 - t1)))
    merged = None
    if parts is not None:
        merged = {}
        for values, _ in parts:       # rank order is execution order
            dup = set(values) & set(merged)
            if dup:
                raise RuntimeError(f"pipeline: probes {sorted(dup)[:5]} recorded on two ranks")
            merged.update(values)
    return PipelineResult(world.rank, pplan, stage, logits, merged, model, t1 - t0, t2 - t1,
                          [t for _, t in parts] if parts else [])


def _send(x: Any, dst: int) -> None:
    import torch
    import torch.distributed as dist

    x = x.detach().contiguous()
    name = str(x.dtype).removeprefix("torch.")
    if name not in _WIRE_DTYPES or x.dim() > _HEADER - 2:
        raise RuntimeError(f"pipeline: cannot send a {name} tensor of shape {list(x.shape)}")
    head = [_WIRE_DTYPES.index(name), x.dim(), *x.shape] + [0] * (_HEADER - 2 - x.dim())
    dist.send(torch.tensor(head, dtype=torch.int64, device=x.device), dst)
    dist.send(x.reshape(-1).view(torch.uint8), dst)


def _recv(src: int, device: str) -> Any:
    import torch
    import torch.distributed as dist

    head = torch.zeros(_HEADER, dtype=torch.int64, device=device)
    dist.recv(head, src)
    code, ndim, *dims = head.tolist()
    dtype = getattr(torch, _WIRE_DTYPES[code])
    shape = dims[:ndim]
    n = 1
    for d in shape:
        n *= d
    buf = torch.empty(n * torch.empty((), dtype=dtype).element_size(), dtype=torch.uint8, device=device)
    dist.recv(buf, src)
    return buf.view(dtype).reshape(shape)


def weights_read(model: Any) -> list[Any] | None:
    """The parts (``'embed'``, layer indices, ``'head'``) whose weights ``model`` holds: the native
    model's built parts; the reference's fetched weights (only known while it caches them; else None)."""
    if model.side == "native":
        return ((["embed"] if model.embed_weight is not None else [])
                + [i for i, b in enumerate(model.blocks) if b is not None]
                + (["head"] if model.head_module is not None else []))
    store = model.store
    if not store.cache:
        return None
    keys = list(store._memo)
    layers = sorted({layer for _, layer, _, _ in keys if layer is not None})
    globals_ = {name for name, layer, _, _ in keys if layer is None}
    return ((["embed"] if "embed" in globals_ else []) + layers
            + (["head"] if globals_ - {"embed"} else []))


# ---- CLI ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m parity.pipeline",
                                description="One model's layers pipelined over the ranks of a launch: "
                                            "torchrun --nproc-per-node N -m parity.pipeline ...")
    p.add_argument("--checkpoint", default="tiny", help="checkpoint directory or preset (default tiny)")
    p.add_argument("--side", choices=(*SIDES, "both"), default="both", help="which model to run (default both)")
    p.add_argument("--layers", default=None,
                   help='layer plan as JSON: {"0": [0, 1], "1": [2, 3]}, [[0, 1], [2, 3]] or '
                        '{"embed": 0, "0": 0, ..., "head": 1} (default: num_hidden_layers split evenly)')
    p.add_argument("--prompt", default=None, help="prompt id of the set or free text (default: the first chat prompt)")
    p.add_argument("--mode", default="chat", help="chat or thinking (default chat)")
    p.add_argument("--ids", default=None, help="comma-separated token ids instead of a prompt")
    p.add_argument("--plan", default="default", help="native precision plan (default 'default')")
    p.add_argument("--backend", default="auto", help="native kernel backend (default auto)")
    p.add_argument("--profile", default="bf16", help="reference profile (default bf16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (each rank takes cuda:LOCAL_RANK)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank")
    p.add_argument("--save", default=None, help="rank 0 writes {side: {logits, probes, plan, weights_read}} here "
                                                "(torch.save)")
    p.add_argument("--no-probes", action="store_true", help="record no probes (logits only)")
    return p


def parse_layers(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ParityInputError(f"--layers: expected JSON (e.g. '{{\"0\": [0, 1], \"1\": [2, 3]}}'), found "
                               f"{text!r} ({e.msg})") from None


def _token_ids(args: Any) -> tuple[Any, Any]:
    import torch

    from .inputs import encode_prompts, select_prompts
    from .source import resolve_checkpoint

    src = resolve_checkpoint(args.checkpoint)
    if args.ids is not None:
        try:
            ids = [int(t) for t in args.ids.split(",") if t.strip()]
        except ValueError:
            raise ParityInputError(f"--ids: expected comma-separated integers, found {args.ids!r}") from None
        return src, torch.tensor(ids, dtype=torch.int64)
    prompt = encode_prompts(select_prompts(args.mode, [args.prompt] if args.prompt else None)[:1], src.tokenizer,
                            src.config.vocab_size)[0]
    return src, prompt.tensor()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body(console: Any) -> int:
        from .cli import parse_device, set_threads
        from .distributed import gather, init, quiet_console

        layers = parse_layers(args.layers)
        world, device = init(parse_device(args.device))
        if not world.main:
            console = quiet_console()
        make_plan(ModelLoader("native", args.checkpoint).num_layers, world.size, layers)   # bad input before any read
        src, ids = _token_ids(args)
        set_threads(args.threads, device, src.config)
        sides = SIDES if args.side == "both" else (args.side,)
        include = (lambda _n: False) if args.no_probes else None
        saved: dict[str, Any] = {}
        for side in sides:
            opts = ({"profile": args.profile} if side == "reference" else {"plan": args.plan, "backend": args.backend})
            res = pipelined_forward(ModelLoader(side, args.checkpoint, **opts), ids, layers, device=device,
                                    include=include)
            read = gather(weights_read(res.model))
            res.model = None
            if world.main:
                top = int(res.logits[-1].argmax())
                console.print(f"{side}: {res.plan.size} rank(s) {res.plan.blocks()}, {len(ids)} tokens, logits "
                              f"{list(res.logits.shape)}, next token {top}, {len(res.probes)} probes; per rank load/"
                              f"forward s: " + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in res.timings))
                saved[side] = {"logits": res.logits.cpu(), "probes": res.probes, "plan": res.plan.blocks(),
                               "weights_read": read, "ids": ids}
        if args.save and world.main:
            import torch

            torch.save(saved, args.save)
        return 0

    from .cli import run_cli

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
