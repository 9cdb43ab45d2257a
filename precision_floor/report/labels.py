"""Label placement for the inline SVG plots: each label takes the first candidate position whose box
overlaps no label (or reserved box) placed before it; a label with no free position is dropped (its
text stays in the point's tooltip). Boxes are estimated from the font size, conservatively (a glyph
of system-ui sans averages ~0.55 em; 0.62 em is assumed), and the report's Chromium test measures
the real boxes with getBBox()."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

EM_PER_CHAR = 0.62
ASCENT, DESCENT = 0.80, 0.25     # of the font size, above / below the baseline


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: Box, pad: float = 1.0) -> bool:
        return not (self.x1 + pad <= other.x0 or other.x1 + pad <= self.x0 or
                    self.y1 + pad <= other.y0 or other.y1 + pad <= self.y0)

    def inside(self, other: Box) -> bool:
        return other.x0 <= self.x0 and self.x1 <= other.x1 and other.y0 <= self.y0 and self.y1 <= other.y1


def text_box(x: float, y: float, text: str, size: float, anchor: str = "start") -> Box:
    """The box of ``text`` drawn at (x, baseline y) with ``text-anchor`` = anchor."""
    w = EM_PER_CHAR * size * len(text)
    x0 = x if anchor == "start" else x - w if anchor == "end" else x - w / 2
    return Box(x0, y - ASCENT * size, x0 + w, y + DESCENT * size)


@dataclass
class Placer:
    bounds: Box
    taken: list[Box] = field(default_factory=list)

    def reserve(self, box: Box) -> None:
        self.taken.append(box)

    def place(self, text: str, size: float, candidates: Sequence[tuple[float, float, str]]) \
            -> tuple[float, float, str] | None:
        for x, y, anchor in candidates:
            b = text_box(x, y, text, size, anchor)
            if b.inside(self.bounds) and not any(b.overlaps(t) for t in self.taken):
                self.taken.append(b)
                return x, y, anchor
        return None


def around(x: float, y: float, gap: float = 7.0, size: float = 10.0, rows: int = 4) \
        -> list[tuple[float, float, str]]:
    """Candidate positions next to a point: right/left, above/below, then stacked further away."""
    line = size * 1.2
    out: list[tuple[float, float, str]] = []
    for k in range(rows):
        for dx, anchor in ((gap, "start"), (-gap, "end")):
            out.append((x + dx, y - gap - k * line, anchor))
            out.append((x + dx, y + gap + size * ASCENT + k * line, anchor))
    return out


__all__ = ["Box", "Placer", "around", "text_box"]
