"""The JSONL record schema: round trips, atomic writes, validation, non-finite values."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from parity.errors import RecordsError
from parity.records import FIELDS, SCHEMA_VERSION, frame_records, read_records, to_frame, write_records

from .records_util import ctx, rec


def test_record_fills_layer_and_component_from_the_probe() -> None:
    r = rec("layers.3.attn.q", "cosine", 0.99)
    assert tuple(r) == FIELDS
    assert (r["layer"], r["component"], r["schema_version"]) == (3, "attn_q", SCHEMA_VERSION)
    assert rec("logits", "kl_mean", 0.1)["layer"] is None


def test_round_trip_with_non_finite_values(tmp_path: Path) -> None:
    rows = [rec("layers.0.out", "snr_db", math.inf), rec("logits", "kl_se", math.nan), rec("embed", "cosine", 1.0)]
    path = tmp_path / "r.jsonl"
    assert write_records(path, rows) == 3
    for line in path.read_text().splitlines():
        json.loads(line)   # standard JSON: no Infinity / NaN literals
    df = read_records(path)
    assert math.isinf(df["value"][0]) and math.isnan(df["value"][1]) and df["value"][2] == 1.0
    assert list(df.columns) == list(FIELDS)
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]   # no temporary file left behind


def test_append_keeps_existing_rows(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    write_records(path, [rec("embed", "cosine", 1.0)])
    write_records(path, [rec("logits", "kl_mean", 0.5)], append=True)
    assert read_records(path)["metric"].tolist() == ["cosine", "kl_mean"]
    write_records(path, [rec("logits", "kl_mean", 0.5)])
    assert len(read_records(path)) == 1


def test_frame_round_trip_restores_ints_and_nulls(tmp_path: Path) -> None:
    rows = [rec("layers.2.out", "cosine", 0.9), rec("logits", "kl", 0.1)]
    back = frame_records(to_frame(rows))
    assert back[0]["layer"] == 2 and back[1]["layer"] is None and back[0]["seed"] == 0
    write_records(tmp_path / "x.jsonl", back)
    assert read_records(tmp_path / "x.jsonl")["value"].tolist() == [0.9, 0.1]


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("metric"), "missing"),
    (lambda r: r.update(extra=1), "unexpected"),
    (lambda r: r.update(schema_version=99), "schema_version"),
    (lambda r: r.update(probe="layers.0.attn.bogus"), "unknown probe"),
    (lambda r: r.update(value="big"), "value"),
    (lambda r: r.update(layer=1.5), "layer"),
])
def test_invalid_records_are_rejected(tmp_path: Path, mutate, message: str) -> None:
    r = rec("layers.0.out", "cosine", 1.0)
    mutate(r)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(r) + "\n")
    with pytest.raises(RecordsError, match=message):
        read_records(path)


def test_malformed_jsonl_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(rec("embed", "cosine", 1.0)) + "\n{not json\n")
    with pytest.raises(RecordsError, match=r"bad\.jsonl:2"):
        read_records(path)
    with pytest.raises(RecordsError, match="expected a JSONL file"):
        read_records(tmp_path / "missing.jsonl")


def test_context_replace() -> None:
    assert ctx().replace(fault="x").fault == "x"
