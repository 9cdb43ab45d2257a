"""Dumps written from inside a running engine: what the vLLM and SGLang plugins attach to the model.

:class:`LiveDump` keeps forward hooks from a probe table (``parity.engines.hooks`` rows) on the
engine's own model instance for as long as the model lives. A forward pass of the root module whose
``input_ids`` hold at least ``min_tokens`` tokens (a prefill; one-token decode steps are skipped)
opens a pass; the table's modules fill it; the pass is written as one dump (``parity.dumps``, with
``probe_subset``) when every row has been seen, or when the next pass starts (a probe computed after
the root forward, such as vLLM's logits, still lands in its pass). A probe whose first dimension is
not the pass's token count (vLLM's logits without prompt logprobs: the sampled rows only) is left
out of the dump and named in the log: the contract would refuse it, and a wrong row is worse than none.

Switched on by the environment, in every process the engine loads its plugins in:

* ``DSV4_PARITY_DUMP_DIR``     where dumps go (one sub-directory per pass); unset: the plugins do nothing;
* ``DSV4_PARITY_DUMP_MAX``     passes to write per process (default 1);
* ``DSV4_PARITY_DUMP_MODE``    the prompt mode the engine was given (``chat`` | ``thinking``, default chat);
* ``DSV4_PARITY_DUMP_PROMPT_ID``  the standard prompt's id, when the engine ran one (checked on read).

Only the rank-0 process of a ``torch.distributed`` group writes (the tables hold for tensor
parallelism 1). Hooks fire only where the engine runs modules eagerly: vLLM ``enforce_eager=True``,
SGLang ``--cuda-graph-backend-prefill=disabled`` (docs/engines.md)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .hooks import Row

log = logging.getLogger("dsv4_parity.live_dump")
ENV_DIR, ENV_MAX, ENV_MODE, ENV_PROMPT = ("DSV4_PARITY_DUMP_DIR", "DSV4_PARITY_DUMP_MAX", "DSV4_PARITY_DUMP_MODE",
                                          "DSV4_PARITY_DUMP_PROMPT_ID")


@dataclass(frozen=True)
class LiveSettings:
    out: Path
    max_dumps: int = 1
    prompt_mode: str = "chat"
    prompt_id: str | None = None


def settings_from_env(env: Any = None) -> LiveSettings | None:
    """The dump settings of this process, None when ``DSV4_PARITY_DUMP_DIR`` is unset; a bad value is
    one ValueError naming the variable, what was expected and what was found."""
    from dsv4.encoding import THINKING_MODES

    env = os.environ if env is None else env
    out = env.get(ENV_DIR)
    if not out:
        return None
    raw = env.get(ENV_MAX, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV_MAX}: expected a positive integer, found {raw!r}")
    mode = env.get(ENV_MODE, "chat")
    if mode not in THINKING_MODES:
        raise ValueError(f"{ENV_MODE}: expected one of {list(THINKING_MODES)}, found {mode!r}")
    return LiveSettings(Path(out), n, mode, env.get(ENV_PROMPT) or None)


def _input_ids(args: tuple, kwargs: dict) -> Any:
    ids = kwargs.get("input_ids", args[0] if args else None)
    return ids if hasattr(ids, "numel") else None


class LiveDump:
    """Hooks of ``rows`` on ``model`` (kept until :meth:`detach`) writing one dump per prefill pass."""

    def __init__(self, model: Any, rows: Sequence[Row], settings: LiveSettings, *, engine: str, table: str,
                 min_tokens: int = 2) -> None:
        mods = dict(model.named_modules())
        missing = [(p, path) for p, path, _, _ in rows if path not in mods]
        if missing:
            raise ValueError(f"{type(model).__name__}: expected modules {[m[1] for m in missing[:3]]} for probes "
                             f"{[m[0] for m in missing[:3]]} ({table}), found none; another engine version?")
        self.settings, self.engine, self.min_tokens = settings, engine, min_tokens
        self.expected = {p for p, _, _, _ in rows}
        self.written: list[Path] = []
        self._ids: list[int] | None = None
        self._got: dict[str, Any] = {}
        self._dtype: str | None = None
        self._hooks = [model.register_forward_pre_hook(self._start, with_kwargs=True)]
        for probe, path, kind, _layout in rows:
            m = mods[path]
            if kind == "out":
                self._hooks.append(m.register_forward_hook(lambda _m, _i, o, p=probe: self._keep(p, o)))
            else:
                self._hooks.append(m.register_forward_pre_hook(lambda _m, i, p=probe: self._keep(p, i[0]) if i else None))

    # ---- hooks ------------------------------------------------------------------------------------
    def _start(self, _module: Any, args: tuple, kwargs: dict) -> None:
        self._flush()
        ids = _input_ids(args, kwargs)
        if ids is None or ids.numel() < self.min_tokens or len(self.written) >= self.settings.max_dumps:
            return
        self._ids = [int(t) for t in ids.reshape(-1).tolist()]

    def _keep(self, probe: str, t: Any) -> None:
        if self._ids is None:
            return
        t = t[0] if isinstance(t, (tuple, list)) else t
        self._got[probe] = t.detach().to("cpu")
        if self._dtype is None and t.is_floating_point():
            self._dtype = str(t.dtype).removeprefix("torch.")
        if self.expected <= set(self._got):
            self._flush()

    # ---- writing ----------------------------------------------------------------------------------
    def _flush(self) -> None:
        ids, got = self._ids, self._got
        self._ids, self._got = None, {}
        if ids is None or not got:
            return
        from ..dumps import write_dump

        kept = {p: t for p, t in got.items() if t.dim() >= 1 and t.shape[0] == len(ids)}
        for p in sorted(set(got) - set(kept)):
            log.warning("%s: probe %s left out of the dump: %d rows, the pass has %d tokens", self.engine, p,
                        got[p].shape[0] if got[p].dim() else 0, len(ids))
        if not kept:
            return
        out = self.settings.out / f"{self.engine}-pid{os.getpid()}-{len(self.written)}"
        write_dump(out, kept, engine=self.engine, token_ids=ids, prompt_mode=self.settings.prompt_mode,
                   prompt_id=self.settings.prompt_id, dtype=self._dtype, probe_subset=True)
        self.written.append(out)
        log.info("%s: wrote %s (%d probes, %d tokens)", self.engine, out, len(kept), len(ids))

    def detach(self) -> None:
        """Write a pass still open and remove every hook."""
        self._flush()
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:   # noqa: BLE001  (no process group: a single process)
        return 0


def engine_label(name: str, installed: str, pinned: str) -> str:
    """``name-installed``; a version other than the table's is said once (its rows may not hold)."""
    if installed != pinned:
        log.warning("%s %s: the probe table was read from %s %s; a module it names may be missing or differ",
                    name, installed, name, pinned)
    return f"{name}-{installed}"


def engine_rows(model: Any, engine_map: Any) -> list[Row]:
    """An engine table's target rows for this model instance (its layer count read off the model)."""
    from .hooks import layer_rows

    n = len(model.get_submodule(engine_map.LAYERS_PATH))
    return layer_rows(engine_map.LAYER_PROBES, engine_map.LAYERS_PATH, n) + list(engine_map.GLOBAL_PROBES)


def attach_from_env(model: Any, engine_map: Any, *, engine: str) -> LiveDump | None:
    """A :class:`LiveDump` of ``engine_map``'s table on ``model`` when this process is switched on
    (and rank 0), else None."""
    settings = settings_from_env()
    if settings is None or _rank() != 0:
        return None
    rows, table = engine_rows(model, engine_map), f"parity/engines/{engine_map.__name__.rsplit('.', 1)[-1]}.py"
    dump = LiveDump(model, rows, settings, engine=engine, table=table)
    import atexit

    atexit.register(dump.detach)
    log.info("%s: dumping %d probes of up to %d prefill passes to %s", engine, len(dump.expected),
             settings.max_dumps, settings.out)
    return dump
