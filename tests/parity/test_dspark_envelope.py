"""The draft floor rules' envelope over machine types (parity.dspark.calibrate.envelope): the looser
bound of each rule, every machine's bound kept, a rate rule's mean and count from the side taken; and
``calibrate --envelope`` refuses a bad file before any run."""
from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from parity.dspark.__main__ import main
from parity.dspark.calibrate import allowed_error, envelope, to_toml
from parity.dspark.judge import load_floor_rules


def _rule(probe: str, metric: str, direction: str, bound: float, **extra) -> dict:
    return {"profile": "bf16", "mode": "propagated", "probe": probe, "metric": metric, "direction": direction,
            "bound": bound, "note": f"worst {bound}", **extra}


def test_envelope_takes_the_looser_side_and_keeps_every_machine() -> None:
    old = [_rule("a", "rel_diff", "max", 1e-4), _rule("a", "cosine", "min", 0.9999),
           _rule("l", "top1_agree", "min", 0.89, mean=0.97, n=100), _rule("only-old", "kl", "max", 2.0)]
    new = [_rule("a", "rel_diff", "max", 0.1), _rule("a", "cosine", "min", 0.99995),
           _rule("l", "top1_agree", "min", 0.85, mean=0.95, n=110), _rule("only-new", "kl", "max", 3.0)]
    prev = {(r["profile"], r["mode"], r["probe"], r["metric"]): r for r in old}
    got = {(r["probe"], r["metric"]): r for r in envelope(new, prev, "here")}
    assert got["a", "rel_diff"]["bound"] == 0.1 and got["a", "rel_diff"]["calibrated"] == [1e-4, 0.1]
    assert "previous file needs only 0.0001" in got["a", "rel_diff"]["note"]
    assert got["a", "cosine"]["bound"] == 0.9999 and "here needs only 0.99995" in got["a", "cosine"]["note"]
    assert (got["l", "top1_agree"]["bound"], got["l", "top1_agree"]["mean"], got["l", "top1_agree"]["n"]) == (0.85, 0.95, 110)
    assert got["only-old", "kl"]["bound"] == 2.0 and got["only-new", "kl"]["bound"] == 3.0
    assert allowed_error(got["a", "cosine"]) == max(allowed_error({**got["a", "cosine"], "bound": b})
                                                    for b in got["a", "cosine"]["calibrated"])


def test_envelope_round_trips_through_toml(tmp_path: Path) -> None:
    prev = {("bf16", "propagated", "a", "rel_diff"): _rule("a", "rel_diff", "max", 1e-4, calibrated=[1e-4, 2e-4])}
    rules = envelope([_rule("a", "rel_diff", "max", 3e-4)], prev, "here")
    f = tmp_path / "r.toml"
    f.write_text(to_toml(rules, "h", "default", "frozen"), encoding="utf-8")
    back, plan = load_floor_rules("x", f)
    assert plan == "default/frozen" and back["bf16", "propagated", "a", "rel_diff"]["calibrated"] == [1e-4, 2e-4, 3e-4]


def test_calibrate_refuses_a_bad_envelope_file_before_any_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("plan = [", encoding="utf-8")
    buf = io.StringIO()
    con = Console(file=buf, width=200)
    code = main(["calibrate", "--checkpoint", "tiny-dspark", "--envelope", str(bad), "--out", str(tmp_path / "o.toml")],
                console=con)
    assert code == 2 and "--envelope: expected a draft floor rules TOML" in buf.getvalue(), buf.getvalue()
    assert not (tmp_path / "o.toml").exists()
    other = tmp_path / "other.toml"
    other.write_text("plan = 'all-bf16'\nact_scale = 'frozen'\n", encoding="utf-8")
    code = main(["calibrate", "--checkpoint", "tiny-dspark", "--envelope", str(other), "--out", str(tmp_path / "o.toml")],
                console=con)
    assert code == 2 and "expected rules of plan default/frozen, found all-bf16/frozen" in buf.getvalue(), buf.getvalue()
