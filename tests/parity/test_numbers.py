"""The one number format: significant figures, counts as integers, similarities by their distance from 1."""
from __future__ import annotations

import math

from hypothesis import given, strategies as st

from parity.numbers import pm, sig


def test_examples_from_real_tables() -> None:
    assert sig(154.0) == "154" and sig(31182.0) == "31182" and sig(361.0) == "361"   # counts, not 361.0000
    assert sig(0.0) == "0" and sig(0.0021) == "0.0021" and sig(2.119e-4) == "2.119e-04"
    assert sig(0.9997044712) == "0.9997045" and sig(0.99776) == "0.99776" and sig(1.0) == "1"
    assert sig(0.333333) == "0.3333" and sig(12345.67) == "12346" and sig(8.103e-5) == "8.103e-05"
    assert sig(float("nan")) == sig(None) == "—" and sig(float("-inf")) == "-inf"
    assert pm(0.1267, 0.025) == "0.1267 ± 0.025" and pm(1.0, 0.0) == "1 ± 0" and pm(0.5, None) == "0.5"


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30))
def test_the_printed_number_is_the_number_to_its_significant_figures(v: float) -> None:
    s = sig(v)
    back = float(s)
    # four significant figures of the value, or of its distance from 1 for a similarity
    scale = abs(1 - abs(v)) if 0.9 < abs(v) < 1 else abs(v)
    assert math.isclose(back, v, rel_tol=0, abs_tol=max(scale * 1e-3, 1e-300)) or back == v, (v, s)
    assert len(s) <= 16
