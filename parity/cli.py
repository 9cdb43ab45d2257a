"""Shared CLI plumbing: exit codes, the error boundary, device parsing, rich progress bars.

Light at import (no torch, pandas or numpy): every ``python -m ... --help`` answers at once, so the
heavy imports live inside the functions that need them."""
from __future__ import annotations

import gc
import json
from pathlib import Path
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from dsv4.checkpoint.builtin import add_checkpoint_argument
from dsv4.checkpoint.errors import CheckpointError
from dsv4.config import ConfigError
from dsv4.plan import PlanError
from dsv4.tokenizer import TokenizerError

from .errors import ParityInputError

DTYPE_NAMES = ("bf16", "fp32")


def torch_dtype(name: str) -> Any:
    """``--ref-dtype`` name -> torch dtype."""
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]

# One contract for every CLI: 0 pass, 1 verdict failure, 2 bad input, 3 the tool itself failed (one
# line on the console, the traceback in a log file whose path is printed), 130 interrupted.
EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_TOOL_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# Exceptions that mean "bad input" at a CLI edge (exit 2); anything else is the tool's own failure (3).
INPUT_ERRORS: tuple[type[BaseException], ...] = (ParityInputError, PlanError, CheckpointError, ConfigError,
                                                 TokenizerError)


def traceback_log(exc: BaseException) -> str:
    """Write ``exc``'s traceback under ``$DSV4_PARITY_CACHE/logs`` (a temp dir if that is not writable)."""
    import os
    import tempfile
    import time
    import traceback
    from pathlib import Path

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{Path(sys.argv[0]).stem or 'parity'}.log"
    for base in (Path(os.environ.get("DSV4_PARITY_CACHE", Path.home() / ".cache" / "dsv4-parity")) / "logs",
                 Path(tempfile.gettempdir()) / "dsv4-parity-logs"):
        try:
            base.mkdir(parents=True, exist_ok=True)
            (base / name).write_text(" ".join(sys.argv) + "\n\n" + text, encoding="utf-8")
            return str(base / name)
        except OSError:
            continue
    return "(no writable log directory)"


def outputs_of(args: Any, **kinds: str) -> dict[str, tuple[str, str]]:
    """The output paths a parsed command line names, as ``{flag: (path, 'file' | 'dir')}``; the
    standard ones plus ``kinds`` (e.g. ``records='dir'``, ``out='file'``; ``''``: an input, not checked)."""
    table = {"records": "file", "json": "file", "reference_cache": "dir", **kinds}
    return {f"--{k.replace('_', '-')}": (str(getattr(args, k)), kind) for k, kind in table.items()
            if kind and getattr(args, k, None)}


def check_outputs(outputs: Mapping[str, tuple[str, str]]) -> None:
    """Before any compute: every output path is creatable and writable (a read-only filesystem, a
    directory where a file goes, a file where a directory goes: bad input naming the flag)."""
    import tempfile

    for flag, (path, kind) in outputs.items():
        p = Path(path).expanduser()
        if kind == "file" and p.is_dir():
            raise ParityInputError(f"{flag} {path}: expected a file path, found a directory")
        if kind == "dir" and p.exists() and not p.is_dir():
            raise ParityInputError(f"{flag} {path}: expected a directory, found a file")
        where = p if kind == "dir" else p.parent
        try:
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=where, prefix=".dsv4-write-probe-"):
                pass
        except OSError as e:
            raise ParityInputError(f"{flag} {path}: expected a writable location, found {e.strerror or e} "
                                   f"({where})") from None


def run_cli(body: Callable[[Any], int], console: Any = None,
            outputs: Mapping[str, tuple[str, str]] | None = None) -> int:
    from .console import make_console
    from .render import error

    console = console or make_console()
    # Everything imported so far (torch, pandas, rich) is long-lived: freezing it keeps the cyclic
    # garbage collector from re-scanning it on every collection the harness's ~10^4 records per run
    # trigger (measured: ~0.25 s of a tiny run, most of the metric overhead).
    gc.freeze()
    try:
        check_outputs(outputs or {})
        return body(console)
    except INPUT_ERRORS as e:
        error(console, str(e))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        error(console, "interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # the tool's own failure: never a traceback that looks like a verdict
        error(console, f"internal error ({type(e).__name__}: {e}); traceback in {traceback_log(e)}")
        return EXIT_TOOL_FAILED


def resolve_run_plan(plan_arg: str, checkpoint: str | None) -> Any:
    """``--plan``: a preset / TOML, or ``checkpoint`` (the plan a ModelOpt / compressed-tensors
    checkpoint's quantization config and tensors imply). A plan that contradicts a checkpoint
    directory's quantization config is bad input naming the module (dsv4.checkpoint_plan)."""
    from dsv4.plan import resolve_plan

    path = Path(checkpoint) if checkpoint else None
    is_dir = path is not None and path.is_dir()
    if plan_arg == "checkpoint":
        if not is_dir:
            raise ParityInputError(f"--plan checkpoint: expected --checkpoint to be a checkpoint directory, "
                                   f"found {checkpoint!r}")
        from dsv4.checkpoint import open_checkpoint
        from dsv4.checkpoint_plan import checkpoint_plan

        plan = checkpoint_plan(open_checkpoint(path))
        if plan is None:
            raise ParityInputError(f"--plan checkpoint: expected a ModelOpt or compressed-tensors quantization "
                                   f"config in {path}, found none")
        return plan
    plan = resolve_plan(plan_arg)
    if is_dir:
        from dsv4.checkpoint import open_checkpoint
        from dsv4.checkpoint_plan import check_plan_against_checkpoint

        check_plan_against_checkpoint(plan, open_checkpoint(path))
    return plan


def parse_device(device: str | None, *, must_exist: bool = True) -> str:
    """``must_exist=False`` (dry runs) checks only the syntax: one can plan for GPUs one lacks."""
    import torch

    from .env import best_device

    if device is None:
        return best_device()
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ParityInputError(f"--device: expected 'cpu' or 'cuda[:N]', found {device!r}") from None
    if d.type == "cuda" and must_exist:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (d.index or 0) >= count:
            raise ParityInputError(f"--device {device}: this machine has {count} CUDA device(s)")
    elif d.type not in ("cpu", "cuda"):
        raise ParityInputError(f"--device: expected 'cpu' or 'cuda[:N]', found {device!r}")
    return str(d)


def parse_device_map(text: str | None) -> dict[Any, str] | None:
    """``'{"embed": "cuda:0", "0": "cuda:0", "1": "cuda:1", "head": "cuda:1"}'`` (layer keys as ints
    or digit strings)."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParityInputError(f"--device-map: expected a JSON object, found invalid JSON ({e.msg})") from None
    if not isinstance(raw, Mapping):
        raise ParityInputError(f"--device-map: expected a JSON object, found {type(raw).__name__}")
    return {int(k) if isinstance(k, str) and k.isdigit() else k: str(v) for k, v in raw.items()}


# A tiny model's tensors are too small to amortize intra-op thread synchronisation: on a shared
# 2-core machine two threads made tiny forwards 5x slower than one (measured; see the README).
TINY_HIDDEN = 1024


def set_threads(threads: int | None, device: str, config: Any) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ParityInputError(f"--threads: expected a positive int, found {threads}")
        torch.set_num_threads(threads)
    elif torch.device(device).type == "cpu" and config.hidden_size <= TINY_HIDDEN:
        torch.set_num_threads(1)


def load_run_source(args: Any, device: str) -> tuple[Any, list[Any]]:
    """The checkpoint and encoded prompts of a model-running CLI (flags of ``add_run_arguments``),
    with the thread count set for that checkpoint on ``device``."""
    from dsv4.encoding_release import release_of

    from .inputs import encode_prompts, select_prompts
    from .source import resolve_checkpoint

    src = resolve_checkpoint(args.checkpoint, args.seed)
    set_threads(args.threads, device, src.config)
    prompts = encode_prompts(select_prompts(args.mode, args.prompt, args.prompt_set), src.tokenizer,
                             src.config.vocab_size, reasoning_effort=getattr(args, "reasoning_effort", None),
                             release=release_of(src.config))   # 0731/0813 checkpoints: the 0731 encoding
    return src, prompts


@contextmanager
def progress_bars(console: Any) -> Iterator[Callable[[str, int, int], None]]:
    """A ``progress(description, done, total)`` callback drawing one transient bar per description
    on stderr, so stdout keeps only the report; plain timestamped lines when stderr is no terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .console import PlainProgress

    if not (console.is_terminal or sys.stderr.isatty()):
        yield PlainProgress().update
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(file=sys.stderr, force_terminal=console.is_terminal), transient=True)
    tasks: dict[str, Any] = {}

    def update(description: str, done: int, total: int) -> None:
        if description not in tasks:
            tasks[description] = bar.add_task(description, total=total)
        bar.update(tasks[description], completed=done, total=total)

    with bar:
        yield update


def add_run_arguments(p: Any, *, backend_help: str, profile_help: str, topk_default: int, topk_help: str) -> None:
    """The flags every model-running CLI shares (first_token, decode): checkpoint, prompts, plan,
    backend, profile, devices, rules, outputs, threads."""
    from dsv4.encoding import THINKING_MODES

    p.add_argument("--mode", choices=THINKING_MODES, default="chat")
    p.add_argument("--reasoning-effort", choices=("low", "high", "max"), default=None,
                   help="thinking prompts only: the encoder's reasoning-effort setting, in the checkpoint's "
                        "release (April: high, max; 0731/0813: low, high, max; another is bad input); prompt ids "
                        "get an '@effort' suffix")
    add_checkpoint_argument(p)
    p.add_argument("--seed", type=int, default=0, help="synthetic seed when --checkpoint is a tiny preset")
    p.add_argument("--prompt", action="append", help="prompt id of the set, or free text (repeatable); "
                                                     "default: every prompt of the set in --mode")
    p.add_argument("--prompt-set", default=None, help="a prompts TOML other than dsv4/data/prompts.toml")
    p.add_argument("--plan", default="default", help="plan preset (default, all-fp4, all-bf16, all-fp32), a TOML "
                   "file, or 'checkpoint' (the plan of a ModelOpt / compressed-tensors checkpoint)")
    p.add_argument("--backend", default="auto", help=backend_help)
    p.add_argument("--profile", choices=("bf16", "official"), default="bf16", help=profile_help)
    p.add_argument("--ref-dtype", choices=DTYPE_NAMES, default="bf16", help="reference activation dtype")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: best available)")
    p.add_argument("--device-map", default=None, help='JSON {"embed"|"head"|layer: device}')
    p.add_argument("--rules", default=None, help="thresholds TOML (default: parity/thresholds/default.toml)")
    p.add_argument("--records", default=None, help="write every measurement as JSONL here")
    p.add_argument("--append", action="store_true", help="append to --records instead of replacing it")
    p.add_argument("--json", default=None, help="write a JSON summary here")
    p.add_argument("--topk", type=int, default=topk_default, help=topk_help)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 for a tiny config on cpu, else torch's default)")
