"""The resumable evaluation store: every evaluated (checkpoint fingerprint, plan key, prompt set,
profile, backend, code version — plus the columns, compare modes and fault that change what is
measured) is computed once and kept as parity records.

Layout of a store directory::

    evals/<digest>.jsonl   the evaluation's records (parity JSONL schema; run_id = "pf-<digest>")
    evals/<digest>.json    its manifest: the key, the plan table, column status, timings, top-k tables
    reference/             the parity reference cache (reference outputs shared by every plan)
    <study>.json           study summaries (flips, search, attribution), re-derivable from the records

Both files of an entry are written atomically (temporary file + rename), records first and the
manifest last: the manifest is the commit marker. A run killed at any point leaves complete entries
and at most one orphan records file, which the next run overwrites — so resuming recomputes nothing
that finished and never reads a half-written file.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from parity.errors import RecordsError
from parity.records import atomic_write_json, read_records, write_records

from .errors import StoreError

STORE_FORMAT = 1
RUN_PREFIX = "pf-"


@dataclass(frozen=True)
class EvalKey:
    """What makes two evaluations the same measurement."""

    checkpoint_fingerprint: str
    plan_key: str
    prompt_set: str           # digest of the prompts' ids, modes and token ids (tokenizer included)
    profile: str
    backend: str              # 'emulated', or the kernel backend requested for the bug-budget column
    code_version: str
    columns: tuple[str, ...] = ("floor",)
    modes: tuple[str, ...] = ("propagated",)
    fault: str | None = None

    def digest(self) -> str:
        blob = json.dumps([STORE_FORMAT, asdict(self)], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:20]

    @property
    def run_id(self) -> str:
        return RUN_PREFIX + self.digest()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["columns"], d["modes"] = list(self.columns), list(self.modes)
        return d


@dataclass(frozen=True)
class EvalContext:
    """Everything of an :class:`EvalKey` except what varies per evaluation (plan, columns, backend):
    one session of evaluations. Study summaries store it, so a report can replay a study from the
    store without the checkpoint."""

    checkpoint_fingerprint: str
    prompt_set: str
    profile: str
    code_version: str
    modes: tuple[str, ...] = ("propagated",)
    fault: str | None = None

    def key(self, plan_key: str, columns: Sequence[str], backend: str) -> EvalKey:
        return EvalKey(self.checkpoint_fingerprint, plan_key, self.prompt_set, self.profile, backend,
                       self.code_version, tuple(columns), self.modes, self.fault)

    def replace(self, **changes: Any) -> "EvalContext":
        return EvalContext(**{**asdict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "modes": list(self.modes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EvalContext":
        try:
            return cls(d["checkpoint_fingerprint"], d["prompt_set"], d["profile"], d["code_version"],
                       tuple(d.get("modes", ("propagated",))), d.get("fault"))
        except (KeyError, TypeError) as e:
            raise StoreError(f"evaluation context: expected checkpoint_fingerprint, prompt_set, profile, "
                             f"code_version (+ modes, fault), found {dict(d)!r} ({e})") from None


def prompt_set_digest(prompts: Sequence[Any]) -> str:
    """Digest of encoded prompts (``id``, ``mode``, ``ids``): another prompt set, subset or tokenizer
    is another measurement."""
    blob = json.dumps([[p.id, p.mode, list(p.ids)] for p in prompts]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class StoredEval:
    manifest: dict[str, Any]
    records: pd.DataFrame


class EvalStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.evals = self.root / "evals"

    @property
    def reference_dir(self) -> Path:
        return self.root / "reference"

    def _paths(self, digest: str) -> tuple[Path, Path]:
        return self.evals / f"{digest}.jsonl", self.evals / f"{digest}.json"

    def has(self, key: EvalKey) -> bool:
        return self._paths(key.digest())[1].exists()

    def put(self, key: EvalKey, records: Iterable[Mapping[str, Any]], manifest: Mapping[str, Any]) -> None:
        rec_path, man_path = self._paths(key.digest())
        n = write_records(rec_path, records)
        atomic_write_json(man_path, {**manifest, "store_format": STORE_FORMAT, "digest": key.digest(),
                                     "run_id": key.run_id, "key": key.to_dict(), "n_records": n})

    def manifest(self, digest: str) -> dict[str, Any]:
        path = self._paths(digest)[1]
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise StoreError(f"store {self.root}: expected a manifest {path.name}, found none") from None
        except json.JSONDecodeError as e:
            raise StoreError(f"store {self.root}: manifest {path.name}: expected JSON, found invalid JSON "
                             f"({e.msg})") from None
        if m.get("store_format") != STORE_FORMAT or m.get("digest") != digest:
            raise StoreError(f"store {self.root}: manifest {path.name}: expected store format {STORE_FORMAT} and "
                             f"digest {digest}, found {m.get('store_format')!r} / {m.get('digest')!r}")
        return m

    def load(self, key: EvalKey) -> StoredEval:
        digest = key.digest()
        return StoredEval(self.manifest(digest), self._read(digest))

    def _read(self, digest: str) -> pd.DataFrame:
        path = self._paths(digest)[0]
        if not path.exists():
            raise StoreError(f"store {self.root}: manifest {digest}.json without its records {path.name}")
        try:
            return read_records(path)
        except RecordsError as e:
            raise StoreError(f"store {self.root}: {e}") from None

    def manifests(self) -> list[dict[str, Any]]:
        """Every complete entry's manifest (orphan records files without a manifest are ignored)."""
        if not self.evals.is_dir():
            return []
        return [self.manifest(p.stem) for p in sorted(self.evals.glob("*.json"))]

    def records(self, digests: Iterable[str] | None = None) -> pd.DataFrame:
        """The records of the given (default: every complete) entry as one DataFrame."""
        digests = [m["digest"] for m in self.manifests()] if digests is None else list(digests)
        paths = []
        for d in digests:
            rec, man = self._paths(d)
            if not man.exists() or not rec.exists():
                raise StoreError(f"store {self.root}: entry {d}: expected its manifest and records, found "
                                 f"{'no manifest' if not man.exists() else 'no records'}")
            paths.append(rec)
        if not paths:
            raise StoreError(f"store {self.root}: expected at least one evaluation, found none")
        try:
            return read_records(paths)
        except RecordsError as e:
            raise StoreError(f"store {self.root}: {e}") from None

    # ---- study summaries ----------------------------------------------------------------------------
    def write_json(self, name: str, obj: Any) -> Path:
        """Under torchrun rank 0 writes and every rank waits for it (one writer, read after)."""
        from parity.distributed import barrier, current

        path = self.root / f"{name}.json"
        if current().main:
            atomic_write_json(path, obj)
        barrier()
        return path

    def read_json(self, name: str) -> Any | None:
        path = self.root / f"{name}.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise StoreError(f"store {self.root}: {path.name}: expected JSON, found invalid JSON ({e.msg})") from None


__all__ = ["EvalContext", "EvalKey", "EvalStore", "RUN_PREFIX", "STORE_FORMAT", "StoredEval", "prompt_set_digest"]
