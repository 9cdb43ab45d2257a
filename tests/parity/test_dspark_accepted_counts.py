"""The speculative-loop checks of draft parity (parity/dspark/judge.py ``acceptance_checks``), on
hand-made runs: accepted counts are exact outside near ties in the logic column; in the bug-budget
column a difference past a near tie is judged by the pair's τ band (a kernel's FP32 summation order
may part two exact-to-bound models), and a τ shift beyond the band still fails."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from parity.dspark.judge import acceptance_checks
from parity.dspark.loop import Greedy, Speculation
from parity.dspark.run import PAIRS, ColumnRun

GAMMA = 3


def _spec(accepted: list[int], margin: float = 1.0) -> Speculation:
    toks = list(range(sum(a + 1 for a in accepted)))
    return Speculation(toks, accepted=list(accepted), reject_margin=[margin] * len(accepted), margins=[1.0] * len(toks))


def _result(column: str, base: list[int], other: list[int], margin: float = 1.0) -> SimpleNamespace:
    """Two prompts; anchor+anchor accepts ``base`` on both, the pairs with the test target ``other`` on p1."""
    run = ColumnRun(column, "anchor", "test", True)
    for pair in PAIRS:
        tgt_test = pair.startswith("test")
        run.spec[pair] = {"p0": _spec(base, margin), "p1": _spec(other if tgt_test else base, margin)}
    for who in ("anchor", "test"):
        run.greedy[who] = {pid: Greedy(s.tokens, s.margins) for pid, s in run.spec[f"{who}+{who}"].items()}
    return SimpleNamespace(spec=SimpleNamespace(near_tie=1e-3), columns={column: run})


def _counts(res) -> dict[str, tuple[str, bool]]:
    return {c.where: (c.value, c.passed) for c in acceptance_checks(res) if c.check == "accepted_counts"}


BASE = [1, 0, 2, 1, 0, 0, 1, 3, 0, 1] * 4
SWAPPED = [0, 1] + BASE[2:]           # same τ within noise: a first step decided otherwise
SHIFTED = [3] * len(BASE)              # every draft token accepted: τ far beyond the band


def test_logic_column_accepted_counts_are_exact_outside_near_ties() -> None:
    got = _counts(_result("logic", BASE, SWAPPED))
    assert got["test+test vs anchor+anchor p1"] == ("differ", False)
    assert got["test+test vs anchor+anchor p0"] == ("identical", True)


def test_a_near_tie_explains_a_difference_in_every_column() -> None:
    for col in ("logic", "bug_budget"):
        assert _counts(_result(col, BASE, SWAPPED, margin=1e-4))["test+test vs anchor+anchor p1"] == ("near tie", True)


def test_bug_budget_difference_past_a_near_tie_is_judged_by_the_tau_band() -> None:
    got = _counts(_result("bug_budget", BASE, SWAPPED))
    value, passed = got["test+test vs anchor+anchor p1"]
    assert passed and value.startswith("differ, within the τ band")


@pytest.mark.parametrize("col", ["logic", "bug_budget"])
def test_a_tau_shift_beyond_the_band_fails(col: str) -> None:
    assert _counts(_result(col, BASE, SHIFTED))["test+anchor vs anchor+anchor p1"] == ("differ", False)


def test_a_column_without_speculation_has_no_acceptance_checks() -> None:
    """Draft calls only (``--tokens 0`` in calibration, or a unit of a sharded run before merging):
    nothing to judge, and no division by an empty τ list."""
    for col in ("logic", "floor", "bug_budget"):
        res = SimpleNamespace(spec=SimpleNamespace(near_tie=1e-3), columns={col: ColumnRun(col, "a", "t", True)})
        assert acceptance_checks(res) == []
