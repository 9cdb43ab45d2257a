"""Shared CLI plumbing of the precision-floor tools: common arguments, the session (checkpoint,
prompts, store, evaluator) and the error boundary (bad input -> exit 2, via parity.cli.run_cli)."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dsv4.checkpoint.builtin import add_checkpoint_argument

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from parity.inputs import EncodedPrompt
    from parity.source import CheckpointSource
    from .cache import EvalStore
    from .evaluate import Evaluation, Evaluator


from dsv4.encoding import THINKING_MODES
from parity.cli import outputs_of, parse_device, run_cli, set_threads


ALL_MODES = "all"


def default_records_dir(source: CheckpointSource) -> Path:
    """Per checkpoint, under the project cache (``DSV4_PARITY_CACHE``, default ~/.cache/dsv4-parity)."""
    from dsv4.checkpoint.synth import cache_root

    return cache_root() / "precision-floor" / f"{source.config_name}-{source.fingerprint[:12]}"


def add_common(p: argparse.ArgumentParser) -> None:
    add_checkpoint_argument(p)
    p.add_argument("--seed", type=int, default=0, help="synthetic seed of a tiny preset")
    p.add_argument("--records", default=None,
                   help="evaluation store directory (default: per checkpoint under the project cache)")
    p.add_argument("--resume", action="store_true",
                   help="reuse every evaluation already in --records (without it, each plan is recomputed once)")
    p.add_argument("--mode", choices=(ALL_MODES, *THINKING_MODES), default=ALL_MODES,
                   help="prompts of the standard set to use (default: all of them, both modes)")
    p.add_argument("--prompt", action="append", help="restrict to these prompt ids of the set (repeatable)")
    p.add_argument("--profile", choices=("bf16", "official"), default="bf16", help="reference profile")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: best available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for tiny on cpu)")


def pick_prompts(source: CheckpointSource, mode: str, ids: list[str] | None) -> list[EncodedPrompt]:
    """The standard prompt set (both modes unless ``mode`` picks one), optionally restricted to ids."""
    from dsv4.prompts import load_prompt_set
    from parity.inputs import encode_prompts, select_prompts
    from .errors import FloorInputError

    if mode == ALL_MODES:
        prompts = load_prompt_set()
        if ids:
            known = {p.id for p in prompts}
            unknown = [i for i in ids if i not in known]
            if unknown:
                raise FloorInputError(f"--prompt: expected ids of the standard set {sorted(known)}, found {unknown}")
            prompts = [p for p in prompts if p.id in ids]
    else:
        prompts = select_prompts(mode, ids)
    return encode_prompts(prompts, source.tokenizer, source.config.vocab_size)


@dataclass
class Session:
    source: CheckpointSource
    store: EvalStore
    evaluator: Evaluator
    device: str = "cpu"
    started: float = field(default_factory=time.perf_counter)

    def header(self) -> dict[str, Any]:
        """What every study summary starts with: the context to replay it, and its provenance."""
        from .provenance import provenance

        return {"context": self.evaluator.context.to_dict(),
                "provenance": provenance(self.source, self.evaluator.prompts, self.device)}

    def finish(self, console: Console) -> None:
        ev = self.evaluator
        console.print(f"store {self.store.root}: {ev.computed} evaluation(s) computed, {ev.loaded} loaded; "
                      f"wall {time.perf_counter() - self.started:.1f} s")


def progress_line(console: Console) -> Callable:
    from rich.console import Console

    from parity.distributed import current

    err = Console(stderr=True, force_terminal=console.is_terminal)
    w = current()
    who = f"rank {w.rank}/{w.size}: " if w.active else ""

    def hook(plan, ev: Evaluation) -> None:
        how = "stored" if ev.cached else f"{ev.manifest.get('seconds', 0.0):.2f} s"
        if ev.cached and w.active and not w.main:
            return                      # under torchrun: each rank names what it computed, rank 0 the rest
        err.print(f"[dim]{who}evaluated {plan.name} ({how})[/dim]")
    return hook


def open_session(args: argparse.Namespace, console: Console, *, reuse: bool | None = None) -> Session:
    from parity.source import resolve_checkpoint
    from .cache import EvalStore
    from .evaluate import Evaluator

    from parity.distributed import init

    # under torchrun: join the launch (gloo on CPU, nccl on CUDA); evaluations spread over the ranks
    _, device = init(parse_device(args.device))
    source = resolve_checkpoint(args.checkpoint, args.seed)
    set_threads(args.threads, device, source.config)
    prompts = pick_prompts(source, args.mode, args.prompt)
    store = EvalStore(Path(args.records) if args.records else default_records_dir(source))
    ev = Evaluator(source, prompts, store, profile=args.profile, device=device,
                   reuse=args.resume if reuse is None else reuse, on_evaluated=progress_line(console))
    return Session(source, store, ev, device)


def run_tool(body: Callable[[Console], int], args: argparse.Namespace | None = None, **kinds: str) -> int:
    """The error boundary; ``args``' output paths (``--records`` a store directory) are checked first."""
    from parity.distributed import env_world, quiet_console

    console = None if env_world().main else quiet_console()     # under torchrun rank 0 prints the report
    return run_cli(body, console, outputs=outputs_of(args, **{"records": "dir", **kinds}) if args is not None else None)


__all__ = ["ALL_MODES", "Session", "add_common", "default_records_dir", "open_session", "pick_prompts", "run_tool"]
