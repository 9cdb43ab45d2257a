"""``parity.bugzoo --resume``: rows measured in the same context are kept, only missing ones run;
a different context (or a row that ended in an error) is measured again."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from parity.bugzoo.__main__ import main as zoo_main
from parity.bugzoo.resume import CONTEXT, merged_summary, previous_records, previous_rows
from parity.records import read_records


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def _summary(rows, **ctx):
    base = {k: f"{k}-value" for k in CONTEXT}
    return {**base, **ctx, "rows": rows, "passed": all(r["passed"] for r in rows)}


def test_rows_are_reused_only_in_the_same_context(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    old = _summary([{"fault": None, "passed": True, "error": None}, {"fault": "a", "passed": True, "error": None},
                    {"fault": "b", "passed": False, "error": "ValueError: boom"}])
    p.write_text(json.dumps(old))
    rows, why = previous_rows(p, _summary([]))
    assert set(rows) == {None, "a"} and "2 row(s) reused" in why          # the errored row is re-run
    rows, why = previous_rows(p, _summary([], plan="other plan"))
    assert rows == {} and "different plan" in why
    assert previous_rows(tmp_path / "absent.json", _summary([]))[0] == {}
    (tmp_path / "bad.json").write_text("{")
    assert previous_rows(tmp_path / "bad.json", _summary([]))[0] == {}


def test_merge_keeps_zoo_order_and_recomputes_passed(tmp_path: Path) -> None:
    new = _summary([{"fault": "b", "passed": False, "error": None}])
    out = merged_summary(new, {None: {"fault": None, "passed": True}, "a": {"fault": "a", "passed": True}},
                         [None, "a", "b"])
    assert [r["fault"] for r in out["rows"]] == [None, "a", "b"] and out["passed"] is False
    assert out["reused_rows"] == ["(clean)", "a"]
    recs = tmp_path / "r.jsonl"
    recs.write_text("".join(json.dumps({"fault": f, "v": i}) + "\n" for i, f in enumerate([None, "a", "b"])))
    assert [r["fault"] for r in previous_records(recs, {None, "a"})] == [None, "a"]


@pytest.mark.parity
def test_resume_measures_only_the_missing_fault(tmp_path: Path) -> None:
    recs, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    con, _ = _console()
    assert zoo_main(["--fault", "hash_routing_ignored", "--records", str(recs), "--json", str(summary)],
                    console=con) == 0
    first = json.loads(summary.read_text())
    con, buf = _console()
    rc = zoo_main(["--fault", "hash_routing_ignored", "--fault", "attention_sink_dropped", "--resume",
                   "--records", str(recs), "--json", str(summary)], console=con)
    out = buf.getvalue()
    assert rc == 0, out
    assert "2 row(s) reused" in out
    s = json.loads(summary.read_text())
    assert [r["fault"] for r in s["rows"]] == [None, "hash_routing_ignored", "attention_sink_dropped"]
    assert s["reused_rows"] == ["(clean)", "hash_routing_ignored"]
    assert s["rows"][:2] == first["rows"]                                   # kept as measured
    assert set(read_records(recs)["fault"].fillna("(clean)")) == {"(clean)", "hash_routing_ignored",
                                                                  "attention_sink_dropped"}
    con, _ = _console()
    assert zoo_main(["--resume", "--fault", "hash_routing_ignored"], console=con) == 2   # nothing to resume from
