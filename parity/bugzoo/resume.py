"""``python -m parity.bugzoo --resume``: keep the rows an earlier run wrote to ``--json`` (and their
records in ``--records``) and measure only the faults it lacks, so an interrupted or extended zoo
redoes nothing. A row is reused only when the earlier run judged the same thing: same checkpoint
fingerprint, plan, profile, rules, prompt set and prompts; a row that ended in an error is re-run.
Without --resume every row is measured afresh (the same meaning as in precision_floor's tools)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

# The summary fields that must match for an earlier row to stand for this run's.
CONTEXT = ("checkpoint", "plan", "profile", "rules", "prompt_set", "prompts")


def previous_rows(json_path: str | Path | None, summary_now: Mapping[str, Any]) -> tuple[dict[Any, dict], str]:
    """Rows of the earlier summary usable now, by fault name (None: the clean row), and why (a line)."""
    if json_path is None:
        return {}, "--resume: no --json summary named, nothing to resume from"
    p = Path(json_path)
    if not p.exists():
        return {}, f"--resume: {p} does not exist yet, every row is measured"
    try:
        old = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        return {}, f"--resume: {p} is not a readable zoo summary ({e}); every row is measured"
    differs = [k for k in CONTEXT if old.get(k) != summary_now.get(k)]
    if differs:
        return {}, f"--resume: {p} was measured with a different {', '.join(differs)}; every row is measured"
    rows = {r.get("fault"): r for r in old.get("rows", []) if not r.get("error")}
    return rows, f"--resume: {len(rows)} row(s) reused from {p}"


def previous_records(path: str | Path | None, faults: set[Any]) -> list[dict[str, Any]]:
    """The earlier records of the reused rows (JSONL, field 'fault'); none when the file is absent."""
    if path is None or not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("fault") in faults:
                out.append(r)
    return out


def merged_summary(new: dict[str, Any], reused: Mapping[Any, dict], order: Sequence[Any]) -> dict[str, Any]:
    """This run's summary with the reused rows put back in zoo order (clean row first)."""
    rows = {r["fault"]: r for r in new["rows"]}
    rows.update({k: v for k, v in reused.items() if k not in rows})
    out = dict(new, rows=[rows[k] for k in order if k in rows])
    out["passed"] = all(r.get("passed") for r in out["rows"])
    out["reused_rows"] = sorted((k or "(clean)") for k in reused if k not in {r["fault"] for r in new["rows"]})
    return out


__all__ = ["CONTEXT", "merged_summary", "previous_records", "previous_rows"]
