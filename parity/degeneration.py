"""Degeneration in generated token streams: short cycles and repeated n-grams.

A greedy decoder that has gone wrong (or a model with a broken cache) typically falls into a loop:
one token repeated, a two-token ping-pong ``a b a b ...``, a period-3 cycle, and so on. Two
detectors, pure functions over token-id lists:

* **Cycles** (:func:`find_loops`): a stretch ``tokens[s:e]`` is a loop of period ``p`` when
  ``tokens[t] == tokens[t - p]`` for every ``t`` in ``[s + p, e)`` and it spans at least
  ``max(min_repeats * p, min_tokens)`` tokens. Each loop is reported once, at its smallest period (a
  ping-pong is also 4-periodic; a stretch covered by a loop of a dividing period is not reported
  again), with where it starts, its cycle and whether it lasts to the end of the stream.
* **Repeated n-grams** (:func:`repeated_ngrams`): n-grams occurring at least ``min_count`` times
  anywhere (a phrase coming back with varying text in between, which no cycle catches), and the
  distinct-n-gram ratio (1.0 for a stream that never repeats an n-gram).

Defaults are chosen so that ordinary text does not alarm: a random or prose stream has no run of
six equal tokens, no ``abababab`` and no 9-token period-3 stretch.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

MIN_REPEATS = 3      # a loop shows its cycle at least three times ...
MIN_TOKENS = 6       # ... and covers at least six tokens (so "the the" or "aa" are no loop)
MAX_PERIOD = 16
NGRAM = 4
NGRAM_MIN_COUNT = 3


@dataclass(frozen=True)
class Loop:
    """``tokens[start:end]`` repeats ``cycle`` (``period`` tokens) ``repeats`` times."""

    start: int
    end: int
    period: int
    cycle: tuple[int, ...]
    to_end: bool

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def repeats(self) -> float:
        return self.length / self.period


@dataclass(frozen=True)
class NGramRepeat:
    ngram: tuple[int, ...]
    count: int
    first: int          # index of its first occurrence
    first_repeat: int   # index of its second occurrence: where the repetition starts


@dataclass(frozen=True)
class DegenerationReport:
    n_tokens: int
    loops: tuple[Loop, ...]
    ngram: int
    repeated: tuple[NGramRepeat, ...]
    distinct_ngram_ratio: float
    settings: dict[str, int] = field(default_factory=dict)

    @property
    def first_loop(self) -> Loop | None:
        return self.loops[0] if self.loops else None

    @property
    def degenerate(self) -> bool:
        """A cycle was found (repeated n-grams alone are reported, not called degeneration)."""
        return bool(self.loops)

    def describe(self) -> str:
        lp = self.first_loop
        if lp is None:
            rep = self.repeated[0] if self.repeated else None
            extra = f"; most repeated {self.ngram}-gram x{rep.count} from step {rep.first_repeat}" if rep else ""
            return f"no loop in {self.n_tokens} tokens{extra}"
        tail = "to the end" if lp.to_end else f"until step {lp.end}"
        return (f"period-{lp.period} loop from step {lp.start} ({lp.repeats:.1f} repeats, {tail}); "
                f"cycle {list(lp.cycle)}")


def _runs(tokens: Sequence[int], p: int) -> list[tuple[int, int]]:
    """Maximal ``[start, end)`` stretches of period ``p`` (``tokens[t] == tokens[t-p]`` inside)."""
    out, run_from = [], None
    for t in range(p, len(tokens) + 1):
        ok = t < len(tokens) and tokens[t] == tokens[t - p]
        if ok and run_from is None:
            run_from = t
        elif not ok and run_from is not None:
            out.append((run_from - p, t))
            run_from = None
    return out


def find_loops(tokens: Sequence[int], *, min_repeats: int = MIN_REPEATS, min_tokens: int = MIN_TOKENS,
               max_period: int = MAX_PERIOD) -> list[Loop]:
    """Every loop of ``tokens``, ordered by start (see the module doc)."""
    if min_repeats < 2 or min_tokens < 2 or max_period < 1:
        raise ValueError(f"loop settings: expected min_repeats >= 2, min_tokens >= 2, max_period >= 1, found "
                         f"{min_repeats}, {min_tokens}, {max_period}")
    toks = [int(t) for t in tokens]
    found: list[Loop] = []
    for p in range(1, max_period + 1):
        for s, e in _runs(toks, p):
            if e - s < max(min_repeats * p, min_tokens):
                continue
            # the same stretch at a smaller period that divides p is the same loop (ping-pong = 4-periodic)
            if any(p % q.period == 0 and q.start <= s and q.end >= e for q in found):
                continue
            found.append(Loop(s, e, p, tuple(toks[s:s + p]), e == len(toks)))
    return sorted(found, key=lambda lp: (lp.start, lp.period))


def repeated_ngrams(tokens: Sequence[int], n: int = NGRAM, min_count: int = NGRAM_MIN_COUNT
                    ) -> tuple[list[NGramRepeat], float]:
    """(n-grams occurring >= ``min_count`` times, most frequent first; distinct n-gram ratio)."""
    if n < 1 or min_count < 2:
        raise ValueError(f"n-gram settings: expected n >= 1 and min_count >= 2, found {n}, {min_count}")
    toks = [int(t) for t in tokens]
    where: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i in range(len(toks) - n + 1):
        where[tuple(toks[i:i + n])].append(i)
    total = max(len(toks) - n + 1, 0)
    ratio = len(where) / total if total else 1.0
    reps = [NGramRepeat(g, len(pos), pos[0], pos[1]) for g, pos in where.items() if len(pos) >= min_count]
    reps.sort(key=lambda r: (-r.count, r.first_repeat))
    return reps, ratio


def analyze(tokens: Sequence[int], *, min_repeats: int = MIN_REPEATS, min_tokens: int = MIN_TOKENS,
            max_period: int = MAX_PERIOD, ngram: int = NGRAM, ngram_min_count: int = NGRAM_MIN_COUNT
            ) -> DegenerationReport:
    loops = find_loops(tokens, min_repeats=min_repeats, min_tokens=min_tokens, max_period=max_period)
    reps, ratio = repeated_ngrams(tokens, ngram, ngram_min_count)
    return DegenerationReport(len(tokens), tuple(loops), ngram, tuple(reps), ratio,
                              {"min_repeats": min_repeats, "min_tokens": min_tokens, "max_period": max_period,
                               "ngram": ngram, "ngram_min_count": ngram_min_count})
