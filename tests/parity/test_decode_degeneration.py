"""The degeneration detector on synthetic token streams: cycles are found where they start, at their
smallest period, and ordinary streams raise no alarm."""
from __future__ import annotations

import random

import pytest

from parity.degeneration import analyze, find_loops, repeated_ngrams


def _random_stream(n: int, seed: int, vocab: int = 512) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def test_ping_pong_from_the_start_is_one_period_two_loop_to_the_end() -> None:
    toks = [289, 6] * 40
    loops = find_loops(toks)
    assert len(loops) == 1
    lp = loops[0]
    # reported at period 2, not again as the 4-, 6-, ... periodic stretch it also is
    assert (lp.start, lp.end, lp.period, lp.cycle, lp.to_end) == (0, 80, 2, (289, 6), True)
    assert lp.repeats == 40


def test_ping_pong_after_a_prefix_starts_where_the_cycle_starts() -> None:
    prefix = [11, 12, 13, 14, 15]
    lp = find_loops(prefix + [7, 8] * 10)[0]
    assert lp.start == 5 and lp.period == 2 and lp.cycle == (7, 8)


def test_period_three_cycle() -> None:
    toks = _random_stream(20, seed=1) + [5, 9, 2] * 6
    loops = find_loops(toks)
    assert [(lp.start, lp.period, lp.cycle) for lp in loops] == [(20, 3, (5, 9, 2))]


def test_repeated_single_token_is_period_one() -> None:
    lp = find_loops([4, 3] + [42] * 12)[0]
    assert (lp.start, lp.period, lp.cycle, lp.length) == (2, 1, (42,), 12)


def test_a_loop_that_stops_is_bounded_and_not_to_the_end() -> None:
    toks = [1, 2] * 6 + _random_stream(30, seed=3, vocab=500)
    toks = [t + 10 if i >= 12 else t for i, t in enumerate(toks)]   # the tail shares no token with the loop
    lp = find_loops(toks)[0]
    assert (lp.start, lp.end, lp.to_end) == (0, 12, False)


def test_two_loops_in_order() -> None:
    toks = [1, 2] * 5 + [100, 101, 102] + [7] * 8
    loops = find_loops(toks)
    assert [(lp.start, lp.period) for lp in loops] == [(0, 2), (13, 1)]


@pytest.mark.parametrize("seed", range(5))
def test_no_false_alarm_on_a_random_stream(seed: int) -> None:
    rep = analyze(_random_stream(400, seed))
    assert not rep.degenerate and rep.first_loop is None
    assert rep.repeated == ()                     # no 4-gram three times in 400 random tokens
    assert rep.distinct_ngram_ratio == 1.0


def test_no_false_alarm_on_prose_bytes() -> None:
    text = ("Mississippi rivers carry sediment; the engineer noted that a lookup table, a hash map and "
            "a balanced tree all answer the same question at different costs. Three little words.")
    rep = analyze(list(text.encode()))
    assert not rep.degenerate, rep.describe()


def test_short_repeats_below_the_thresholds_are_no_loop() -> None:
    # "the the" (period 1, two tokens) and "abab" (two repeats) are language, not degeneration
    assert find_loops([5, 9, 9, 3, 1, 2, 1, 2, 8]) == []


def test_repeated_ngram_with_varying_text_between_is_no_cycle_but_is_reported() -> None:
    phrase = [300, 301, 302, 303, 304]
    toks: list[int] = []
    for k in range(4):
        toks += _random_stream(7, seed=10 + k, vocab=200) + phrase
    rep = analyze(toks, ngram=4, ngram_min_count=3)
    assert not rep.degenerate
    top = rep.repeated[0]
    assert top.ngram == (300, 301, 302, 303) and top.count == 4
    assert top.first == 7 and top.first_repeat == 19
    assert rep.distinct_ngram_ratio < 1.0


def test_describe_names_period_start_and_cycle() -> None:
    text = analyze([3, 4] + [8, 9] * 5).describe()
    assert "period-2 loop from step 2" in text and "[8, 9]" in text


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="min_repeats"):
        find_loops([1, 1, 1], min_repeats=1)
    with pytest.raises(ValueError, match="n-gram"):
        repeated_ngrams([1, 2, 3], n=0)
