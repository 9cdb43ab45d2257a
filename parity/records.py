"""The record schema (docs/records.md): one JSONL row per measured value, written atomically.

Pass/fail is never stored: :mod:`parity.rules` judges records when they are read, so a changed
threshold re-judges old records without re-running a model. Non-finite values (an SNR of identical
tensors is +inf) are written as the strings ``"inf"``, ``"-inf"``, ``"nan"`` so files stay standard JSON.
"""
from __future__ import annotations

import functools
import json
import math
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from dsv4.atomic_io import atomic_write_text
from dsv4.probes import component_of, parse_probe

from .constants import COLUMNS
from .errors import RecordsError

SCHEMA_VERSION = 1
FIELDS: tuple[str, ...] = (
    "schema_version", "run_id", "code_version", "checkpoint_fingerprint", "config_name", "plan", "profile",
    "backend", "device", "versions", "seed", "fault", "prompt_id", "prompt_mode", "pair", "compare_mode",
    "position", "step", "probe", "layer", "component", "metric", "value",
)
PAIRS = COLUMNS
COMPARE_MODES = ("propagated", "isolated")
# The per-call kernel audit's records (parity.audit): judged by exact rules, not by a comparison mode.
AUDIT_MODE = "audit"
RECORD_MODES = COMPARE_MODES + (AUDIT_MODE,)
# prompt_id of aggregates over every prompt of a run (the stat block, set-level rates).
ALL_PROMPTS = "*"
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_INT_FIELDS = ("seed", "position", "step", "layer")


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def encode_value(v: float) -> float | str:
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def decode_value(v: Any) -> float:
    if isinstance(v, str):
        if v not in _NONFINITE:
            raise ValueError(f"expected a number or one of {sorted(_NONFINITE)}, found {v!r}")
        return _NONFINITE[v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, found {v!r}")
    return float(v)


@dataclass(frozen=True)
class RunContext:
    """Fields shared by every record of one measured pair; ``record`` fills the per-value fields."""

    run_id: str
    code_version: str
    checkpoint_fingerprint: str
    config_name: str
    plan: str
    profile: str
    backend: str
    device: str
    versions: Mapping[str, str] = field(default_factory=dict)
    seed: int | None = None
    fault: str | None = None

    def __post_init__(self) -> None:
        # One dict shared by every record of the context (records are read-only once made): a copy
        # per record was measurable garbage-collector load at 10^4 records per run.
        object.__setattr__(self, "versions", dict(self.versions))

    def replace(self, **changes: Any) -> "RunContext":
        return RunContext(**{**asdict(self), **changes})

    def record(self, *, prompt_id: str, prompt_mode: str, pair: str, compare_mode: str, probe: str,
               metric: str, value: float, position: int | None = None, step: int | None = None) -> dict[str, Any]:
        layer, component = _probe_info(probe)
        return {"schema_version": SCHEMA_VERSION, "run_id": self.run_id, "code_version": self.code_version,
                "checkpoint_fingerprint": self.checkpoint_fingerprint, "config_name": self.config_name,
                "plan": self.plan, "profile": self.profile, "backend": self.backend, "device": self.device,
                "versions": self.versions, "seed": self.seed, "fault": self.fault, "prompt_id": prompt_id,
                "prompt_mode": prompt_mode, "pair": pair, "compare_mode": compare_mode, "position": position,
                "step": step, "probe": probe, "layer": layer, "component": component, "metric": metric,
                "value": encode_value(value)}


@functools.lru_cache(maxsize=None)
def _probe_info(probe: str) -> tuple[int | None, str]:
    """(layer, component class) of a probe name: parsed once per name, not once per record."""
    return parse_probe(probe)[0], component_of(probe)


def json_safe(obj: Any) -> Any:
    """NaN / inf are not JSON: write them as strings, as the records do (every JSON writer applies it)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return encode_value(obj)
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(Path(path), json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_records(path: str | Path, records: Iterable[Mapping[str, Any]], *, append: bool = False) -> int:
    """Write records as JSONL atomically (temporary file + rename); ``append`` keeps existing rows.
    Returns the number of rows written by this call."""
    path = Path(path)
    rows = [json.dumps(_validated(r, f"record #{i}"), allow_nan=False, ensure_ascii=False)
            for i, r in enumerate(records)]
    old = path.read_text(encoding="utf-8") if append and path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    atomic_write_text(path, old + "".join(r + "\n" for r in rows))
    return len(rows)


def _validated(r: Mapping[str, Any], where: str) -> dict[str, Any]:
    missing = [f for f in FIELDS if f not in r]
    extra = sorted(set(r) - set(FIELDS))
    if missing or extra:
        raise RecordsError(f"{where}: expected exactly the schema fields {list(FIELDS)}; missing {missing}, "
                           f"unexpected {extra}")
    if r["schema_version"] != SCHEMA_VERSION:
        raise RecordsError(f"{where}: schema_version: expected {SCHEMA_VERSION}, found {r['schema_version']!r}")
    try:
        value = encode_value(decode_value(r["value"]))
    except ValueError as e:
        raise RecordsError(f"{where}: value: {e}") from None
    for key in ("probe", "metric", "pair", "compare_mode", "prompt_id"):
        if not isinstance(r[key], str) or not r[key]:
            raise RecordsError(f"{where}: {key}: expected a non-empty string, found {r[key]!r}")
    try:
        parse_probe(r["probe"])
    except KeyError as e:
        raise RecordsError(f"{where}: {e.args[0]}") from None
    out = {f: r[f] for f in FIELDS}
    out["value"] = value
    for key in _INT_FIELDS:   # rows that went through pandas carry NaN / floats here
        v = out[key]
        if v is not None and not isinstance(v, int):
            if isinstance(v, float) and math.isnan(v):
                out[key] = None
            elif isinstance(v, float) and v.is_integer():
                out[key] = int(v)
            else:
                raise RecordsError(f"{where}: {key}: expected an int or null, found {v!r}")
        elif isinstance(v, bool):
            raise RecordsError(f"{where}: {key}: expected an int or null, found {v!r}")
    return out


def read_records(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Read and validate JSONL files into one DataFrame (``value`` decoded to float)."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    rows: list[dict[str, Any]] = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RecordsError(f"records: expected a JSONL file at {p}, found none") from None
        except UnicodeDecodeError as e:
            raise RecordsError(f"records {p}: expected UTF-8 JSONL, found undecodable bytes ({e})") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordsError(f"records {p}:{n}: expected one JSON object per line, found invalid JSON "
                                   f"({e.msg})") from None
            if not isinstance(obj, dict):
                raise RecordsError(f"records {p}:{n}: expected a JSON object, found {type(obj).__name__}")
            rows.append(_validated(obj, f"records {p}:{n}"))
    if not rows:
        raise RecordsError(f"records: expected at least one record in {[str(p) for p in paths]}, found none")
    df = pd.DataFrame(rows, columns=list(FIELDS))
    df["value"] = [decode_value(v) for v in df["value"]]
    return df


def frame_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame of records back to schema rows (for write_records)."""
    return [_validated(r, f"row {i}") for i, r in enumerate(df[list(FIELDS)].to_dict(orient="records"))]


def to_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """In-memory records (as produced by :meth:`RunContext.record`) as a DataFrame like read_records."""
    rows = [_validated(r, f"record #{i}") for i, r in enumerate(records)]
    df = pd.DataFrame(rows, columns=list(FIELDS))
    df["value"] = [decode_value(v) for v in df["value"]]
    return df
