"""Runs spread over the ranks of a ``torchrun`` launch (one door for every multi-process run).

Nothing here schedules work of its own: ranks, collectives and the process group are
``torch.distributed``'s (gloo on CPU, nccl on CUDA, plus a gloo group for Python objects so records
never travel through GPU memory). A CLI launched as ``torchrun --nproc-per-node N -m parity.first_token
...`` detects ``WORLD_SIZE`` / ``RANK`` / ``LOCAL_RANK`` through :func:`init` and needs no flag:

* :func:`run_threeway_sharded`: the prompt set split over the ranks (prompt ``i`` on rank ``i % N``),
  each rank running the three columns on its share; the per-prompt records, the position statistics
  and the audit tallies are gathered and merged into the :class:`~parity.threeway.ThreeWayResult` one
  process would have produced (same records in the same order; the run-level aggregates recomputed
  from every prompt's positions). Rank 0 writes and prints; the others stay quiet.
* the precision-floor studies (``precision_floor.distributed``) spread plan evaluations over ranks,
  each evaluation written by exactly one rank into the shared store.

The reference cache and the stores must be on a filesystem every rank sees (one node: any local
directory; several nodes: a shared one); :func:`check_shared_dir` says so before any compute.
With ``WORLD_SIZE`` unset or 1 every function here is the single-process identity.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence, TypeVar

from .errors import ParityInputError

T = TypeVar("T")
# A rank that dies leaves the others in a collective; torchrun's agent tears them down, and this
# bounds the wait where no agent does (a plain mp.spawn).
TIMEOUT = timedelta(minutes=float(os.environ.get("DSV4_PARITY_DIST_TIMEOUT_MIN", "60")))


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


_OBJECTS_GROUP: Any = None   # the gloo group for object collectives when the default group is nccl


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ParityInputError(f"{name}: expected an integer (set by torchrun), found {raw!r}") from None


def env_world() -> World:
    """The launch as the environment describes it (torchrun sets these variables)."""
    size, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", rank)
    if size < 1 or not 0 <= rank < size:
        raise ParityInputError(f"RANK/WORLD_SIZE: expected 0 <= RANK < WORLD_SIZE, found RANK={rank} "
                               f"WORLD_SIZE={size}")
    return World(rank, size, local)


def current() -> World:
    """The initialized process group's world, else one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", dist.get_rank()))
    return World()


def init(device: str, *, shared_gpus: bool = False) -> tuple[World, str]:
    """Join the launch's process group if ``WORLD_SIZE`` > 1 (once per process) and return the world
    and this rank's device: ``cuda`` becomes ``cuda:LOCAL_RANK``; an explicit ``cuda:N`` under a
    multi-rank launch is bad input (each rank owns its local GPU).

    ``shared_gpus``: for runs whose ranks exchange Python objects only (prompt shards of a launch-bound
    tiny model), more local ranks than GPUs is allowed: rank r uses ``cuda:(LOCAL_RANK % GPUs)`` and the
    process group is gloo (NCCL refuses two ranks on one GPU)."""
    import torch
    import torch.distributed as dist

    global _OBJECTS_GROUP
    w = env_world()
    if not w.active:
        return w, device
    kind = torch.device(device).type
    backend = "gloo"
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        local_size = _env_int("LOCAL_WORLD_SIZE", w.size)
        share = shared_gpus and count > 0 and local_size > count
        gpu = w.local_rank % count if share else w.local_rank
        idx = torch.device(device).index
        if idx is not None and idx != gpu:
            raise ParityInputError(f"--device {device}: under torchrun each rank uses its local GPU; expected "
                                   f"'cuda' or 'cuda:{gpu}' on local rank {w.local_rank}, found {device!r}")
        if gpu >= count:
            raise ParityInputError(f"torchrun: expected a GPU per local rank, found local rank {w.local_rank} "
                                   f"on a machine with {count} CUDA device(s)")
        device = f"cuda:{gpu}"
        torch.cuda.set_device(device)
        backend = "gloo" if share else "nccl"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=TIMEOUT)
        _OBJECTS_GROUP = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend == "nccl" else None
        import atexit

        atexit.register(_finish)
    return current(), device


def _finish() -> None:
    """Leave the process group before the interpreter exits: a group left to the interpreter's teardown
    destroys gloo's still-joinable threads, and the C++ runtime aborts the rank after its work is done
    ("terminate called without an active exception", exit -6: seen in 7 of 10 three-rank launches)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if current().active:
        import torch.distributed as dist

        dist.barrier(group=_OBJECTS_GROUP)


def all_gather(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` in one process)."""
    w = current()
    if not w.active:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * w.size
    dist.all_gather_object(out, obj, group=_OBJECTS_GROUP)
    return out


def gather(obj: T) -> list[T] | None:
    """Every rank's ``obj`` in rank order on rank 0, None on the others (``[obj]`` in one process)."""
    w = current()
    if not w.active:
        return [obj]
    import torch.distributed as dist

    out: list[Any] | None = [None] * w.size if w.main else None
    dist.gather_object(obj, out, dst=0, group=_OBJECTS_GROUP)
    return out


def broadcast(obj: T) -> T:
    """Rank 0's ``obj`` on every rank."""
    if not current().active:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_OBJECTS_GROUP)
    return box[0]


def shard(items: Sequence[T], world: World | None = None) -> list[T]:
    """This rank's share: items ``rank, rank + N, ...`` (round robin keeps long and short prompts mixed)."""
    w = world or current()
    return list(items[w.rank::w.size])


def check_shared_dir(path: str | Path, what: str) -> None:
    """Every rank must see the same directory (stores, the reference cache): rank 0 writes a marker,
    every rank looks for it. Bad input naming the flag otherwise."""
    w = current()
    if not w.active:
        return
    root = Path(path)
    token = broadcast(f".dsv4-shared-{os.getpid()}-{os.urandom(4).hex()}")
    if w.main:
        root.mkdir(parents=True, exist_ok=True)
        (root / token).write_text("")
    barrier()
    seen = all_gather((root / token).exists())
    barrier()
    if w.main:
        (root / token).unlink(missing_ok=True)
    if not all(seen):
        missing = [r for r, s in enumerate(seen) if not s]
        raise ParityInputError(f"{what} {root}: expected a directory every rank sees (a shared filesystem), "
                               f"found it missing on rank(s) {missing}")


# ---- the prompt set over ranks --------------------------------------------------------------------------
def run_threeway_sharded(spec: Any, loaders: Any = None, progress: Any = None) -> Any:
    """:func:`parity.threeway.run_threeway` with the prompts split over the ranks; every rank returns
    the merged result (equal to one process's, records in the same order)."""
    from .threeway import run_threeway

    w = current()
    if not w.active:
        return run_threeway(spec, loaders, progress)
    if spec.reference_cache is not None:
        check_shared_dir(spec.reference_cache, "--reference-cache")
    spec = replace(spec, run_id=broadcast(spec.run_id))     # one run: every rank's records share its id
    mine = replace(spec, prompts=shard(spec.prompts, w))
    part = run_threeway(mine, loaders, progress) if mine.prompts else None
    parts = all_gather(_portable(part))
    return merge_results(spec, [p for p in parts if p is not None], w.size)


def _portable(result: Any) -> Any:
    """What crosses processes: a column's exception becomes a RuntimeError carrying its text (an
    arbitrary exception need not pickle); kept audit operands stay on the rank that made them."""
    if result is None:
        return None
    cols = {}
    for n, c in result.columns.items():
        err = c.error if c.error is None else RuntimeError(f"{type(c.error).__name__}: {c.error}")
        cols[n] = replace(c, error=err, last_logits={k: (a.cpu(), b.cpu()) for k, (a, b) in c.last_logits.items()})
    return replace(result, spec=None, columns=cols)


def merge_results(spec: Any, parts: Sequence[Any], size: int) -> Any:
    """One :class:`~parity.threeway.ThreeWayResult` from the prompt shards of ``spec`` over ``size``
    ranks (``parts[r]``: rank r's result; ranks past the last prompt had nothing to run)."""
    from .records import ALL_PROMPTS, AUDIT_MODE
    from .threeway import ThreeWayResult, aggregate_records, run_context

    order = {p.id: i for i, p in enumerate(spec.prompts)}
    if not parts:
        raise ParityInputError("distributed run: expected at least one rank with prompts, found none")
    names = list(parts[0].columns)
    ranks = range(len(parts))
    records: list[dict[str, Any]] = []
    columns: dict[str, Any] = {}
    for name in names:
        cs = [p.columns[name] for p in parts]
        failed = next((c for c in cs if not c.ran), None)
        base = failed or cs[0]
        col = replace(base, last_logits={}, position_stats={}, audit_kept=[k for c in cs for k in c.audit_kept],
                      load_seconds=max(c.load_seconds for c in cs))
        recs = [r for p in parts for r in p.records if r["pair"] == name]
        weight = [r for r in parts[0].records if r["pair"] == name and r["prompt_id"] == ALL_PROMPTS
                  and r["compare_mode"] == AUDIT_MODE]           # one model, one weight audit (every rank's agree)
        per = sorted((r for r in recs if r["prompt_id"] != ALL_PROMPTS and r["compare_mode"] != AUDIT_MODE),
                     key=lambda r: order[r["prompt_id"]])         # stable: each prompt's own order kept
        audit = sorted((r for r in recs if r["prompt_id"] != ALL_PROMPTS and r["compare_mode"] == AUDIT_MODE),
                       key=lambda r: order[r["prompt_id"]])
        records += weight + per
        if failed is None:
            for c in cs:
                col.last_logits.update(c.last_logits)
            col.last_logits = dict(sorted(col.last_logits.items(), key=lambda kv: order[kv[0]]))
            # shard r's i-th prompt is prompt r + i*N of the run (shard()'s round robin)
            stats = {m: sorted(((r + i * size, st) for r, c in zip(ranks, cs) for i, st in c.position_stats.get(m, [])),
                               key=lambda t: t[0]) for m in cs[0].position_stats}
            col.position_stats = stats
            ctx = run_context(spec, plan=_field(recs, "plan", spec.plan.name), profile=_field(recs, "profile", spec.profile),
                              backend=_field(recs, "backend", ""))
            records += aggregate_records(spec, ctx, name, {m: [st for _, st in v] for m, v in stats.items()})
            if cs[0].audit:
                col.audit = _merge_audit([c.audit for c in cs])
        records += audit
        columns[name] = col
    forwards = sorted((f for p in parts for f in p.forwards),
                      key=lambda f: (names.index(f.column) if f.column in names else -1, order.get(f.prompt_id, 0)))
    return ThreeWayResult(spec, records, columns, forwards, max(p.reference_load_seconds for p in parts),
                          sum(p.cache_hits for p in parts))


def _field(recs: Sequence[dict[str, Any]], key: str, default: str) -> str:
    return recs[0][key] if recs else default


def _merge_audit(audits: Sequence[dict[str, Any]]) -> dict[str, Any]:
    firsts = [a["first"] for a in audits if a.get("first")]
    return {"calls": sum(a["calls"] for a in audits), "violations": sum(a["violations"] for a in audits),
            "violating_calls": sum(a["violating_calls"] for a in audits),
            "worst_ratio": max(a["worst_ratio"] for a in audits), "first": firsts[0] if firsts else None,
            "errors": [e for a in audits for e in a["errors"]], "captured": sum(a.get("captured", 0) for a in audits)}


def quiet_console() -> Any:
    """A console for ranks other than 0: the report is printed once."""
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=160)


__all__ = ["World", "all_gather", "barrier", "broadcast", "check_shared_dir", "current", "env_world", "gather",
           "init", "merge_results", "quiet_console", "run_threeway_sharded", "shard"]
