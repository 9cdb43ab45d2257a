"""Hand-written inline SVG plots (no plotting library, no script): a scatter with error bars and a
highlighted front, and a multi-series line plot. Both return an ``<svg>`` element as a string.

Inline SVG in HTML needs no ``xmlns`` attribute, so the report holds no URL at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Sequence

from .labels import Box, Placer, around, text_box

# Colour-blind-safe series colours (Okabe-Ito).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
W, H = 760, 380
MARGIN = dict(left=78, right=20, top=26, bottom=52)


@dataclass
class Axis:
    lo: float
    hi: float
    log: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        if self.log:
            self.lo, self.hi = max(self.lo, 1e-300), max(self.hi, 1e-300)
        if self.hi <= self.lo:   # a single value: give the axis some extent
            pad = abs(self.lo) * 0.1 or 1.0
            self.lo, self.hi = (self.lo / 2, self.hi * 2) if self.log else (self.lo - pad, self.hi + pad)

    def frac(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def ticks(self, n: int = 5) -> list[float]:
        if self.log:
            a, b = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
            step = max(1, (b - a) // 6)
            return [10.0 ** e for e in range(a, b + 1, step) if self.lo <= 10.0 ** e <= self.hi * 1.0001]
        raw = (self.hi - self.lo) / n
        mag = 10 ** math.floor(math.log10(raw))
        step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
        first = math.ceil(self.lo / step) * step
        return [first + i * step for i in range(int((self.hi - first) / step) + 1)]


def padded(values: Sequence[float], log: bool, label: str = "", pad: float = 0.06) -> Axis:
    vals = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    if not vals:
        return Axis(1e-6 if log else 0.0, 1.0, log, label)
    lo, hi = min(vals), max(vals)
    if log:
        f = (hi / lo) ** pad if hi > lo else 2.0
        return Axis(lo / f, hi * f, True, label)
    span = (hi - lo) or abs(hi) or 1.0
    return Axis(lo - pad * span, hi + pad * span, False, label)


def tick_label(v: float, log: bool) -> str:
    if log:
        e = round(math.log10(v))
        return f"1e{e}" if abs(e) >= 3 else f"{v:g}"
    return f"{v:,.6g}"


@dataclass
class Frame:
    x: Axis
    y: Axis
    parts: list[str] = field(default_factory=list)
    labels: Placer = field(default_factory=lambda: Placer(Box(0, 0, W, H)))

    def px(self, v: float) -> float:
        return MARGIN["left"] + self.x.frac(v) * (W - MARGIN["left"] - MARGIN["right"])

    def py(self, v: float) -> float:
        return H - MARGIN["bottom"] - self.y.frac(v) * (H - MARGIN["top"] - MARGIN["bottom"])

    def axes(self) -> None:
        x0, x1 = MARGIN["left"], W - MARGIN["right"]
        y0, y1 = H - MARGIN["bottom"], MARGIN["top"]
        p = self.parts
        for t in self.y.ticks():
            y = self.py(t)
            p.append(f'<line class="grid" x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>')
            p.append(f'<text class="tick" x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{escape(tick_label(t, self.y.log))}</text>')
            self.labels.reserve(text_box(x0 - 6, y + 4, tick_label(t, self.y.log), 11, "end"))
        for t in self.x.ticks():
            x = self.px(t)
            p.append(f'<line class="grid" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}"/>')
            p.append(f'<text class="tick" x="{x:.1f}" y="{y0 + 16}" text-anchor="middle">'
                     f'{escape(tick_label(t, self.x.log))}</text>')
            self.labels.reserve(text_box(x, y0 + 16, tick_label(t, self.x.log), 11, "middle"))
        p.append(f'<rect class="frame" x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}"/>')
        p.append(f'<text class="axis" x="{(x0 + x1) / 2:.1f}" y="{H - 12}" text-anchor="middle">'
                 f'{escape(self.x.label)}</text>')
        p.append(f'<text class="axis" transform="translate(16 {(y0 + y1) / 2:.1f}) rotate(-90)" '
                 f'text-anchor="middle">{escape(self.y.label)}</text>')
        self.labels.reserve(text_box((x0 + x1) / 2, H - 12, self.x.label, 12, "middle"))
        self.labels.reserve(Box(0, y1, 20, y0))     # the rotated y-axis label

    def svg(self, title: str) -> str:
        return (f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{escape(title)}">'
                f'<title>{escape(title)}</title>' + "".join(self.parts) + "</svg>")


@dataclass
class Point:
    x: float
    y: float
    err: float = 0.0          # symmetric y error bar (e.g. one standard error)
    label: str = ""
    cls: str = "pt"           # CSS class: pt | front | floor | ref
    tip: str = ""


def scatter(points: Sequence[Point], *, x_label: str, y_label: str, title: str, log_y: bool = True,
            front: Sequence[Point] = (), budget_y: float | None = None) -> str:
    """Points with y error bars, an optional step line through ``front``, a horizontal budget line."""
    ys = [p.y for p in points] + [p.y - p.err for p in points] + [p.y + p.err for p in points]
    if budget_y is not None:
        ys.append(budget_y)
    f = Frame(padded([p.x for p in points], False, x_label), padded(ys, log_y, y_label))
    f.axes()
    if budget_y is not None:
        y = f.py(budget_y)
        f.parts.append(f'<line class="budget" x1="{MARGIN["left"]}" y1="{y:.1f}" x2="{W - MARGIN["right"]}" '
                       f'y2="{y:.1f}"/>')
        at = f.labels.place(f"budget {budget_y:g}", 11, [(W - MARGIN["right"] - 4, y - 5, "end"),
                                                         (W - MARGIN["right"] - 4, y + 14, "end")])
        if at:
            f.parts.append(f'<text class="budget-label" x="{at[0]:.1f}" y="{at[1]:.1f}" text-anchor="end">'
                           f'budget {budget_y:g}</text>')
    if len(front) > 1:
        pts = sorted(front, key=lambda p: p.x)
        path = " ".join(f"{'M' if i == 0 else 'L'}{f.px(p.x):.1f},{f.py(p.y):.1f}" for i, p in enumerate(pts))
        f.parts.append(f'<path class="front-line" d="{path}"/>')
    # Labels go after every point is drawn, the floor's first: a crowded label is dropped, not overlapped
    # (its text stays in the point's tooltip).
    labelled = sorted((p for p in points if p.label), key=lambda p: p.cls != "floor")
    for p in points:
        x, y = f.px(p.x), f.py(p.y)
        if p.err and math.isfinite(p.err):
            lo = p.y - p.err if not log_y or p.y - p.err > 0 else f.y.lo
            f.parts.append(f'<line class="err" x1="{x:.1f}" y1="{f.py(lo):.1f}" x2="{x:.1f}" '
                           f'y2="{f.py(p.y + p.err):.1f}"/>')
        f.parts.append(f'<circle class="{p.cls}" cx="{x:.1f}" cy="{y:.1f}" r="{6 if p.cls == "floor" else 4}">'
                       f'<title>{escape(p.tip or p.label)}</title></circle>')
    for p in labelled:
        at = f.labels.place(p.label, 10, around(f.px(p.x), f.py(p.y)))
        if at:
            f.parts.append(f'<text class="pt-label" x="{at[0]:.1f}" y="{at[1]:.1f}" text-anchor="{at[2]}">'
                           f'{escape(p.label)}</text>')
    return f.svg(title)


@dataclass
class Series:
    name: str
    ys: Sequence[float | None]


def lines(xs: Sequence[float], series: Sequence[Series], *, x_label: str, y_label: str, title: str,
          log_y: bool = True, x_marks: Sequence[tuple[float, str]] = ()) -> str:
    """One polyline per series over shared ``xs`` (None / non-finite values break the line), vertical
    marks with labels (e.g. layer boundaries), and a legend."""
    vals = [v for s in series for v in s.ys if v is not None]
    f = Frame(padded(list(xs), False, x_label, pad=0.02), padded(vals, log_y, y_label))
    f.axes()
    for n, s in enumerate(series):   # the legend first: it always shows
        lx = MARGIN["left"] + sum(34 + 7 * len(t.name) for t in series[:n])
        f.labels.reserve(text_box(lx + 24, 14, s.name, 12))
    for x, label in x_marks:
        px = f.px(x)
        f.parts.append(f'<line class="mark" x1="{px:.1f}" y1="{MARGIN["top"]}" x2="{px:.1f}" '
                       f'y2="{H - MARGIN["bottom"]}"/>')
        # Two rows at the top of the frame; a mark whose label fits in neither keeps its line only.
        at = f.labels.place(label, 10, [(px + 3, MARGIN["top"] + 12 + 12 * k, "start") for k in range(2)])
        if at:
            f.parts.append(f'<text class="mark-label" x="{at[0]:.1f}" y="{at[1]:.1f}">{escape(label)}</text>')
    for n, s in enumerate(series):
        color = PALETTE[n % len(PALETTE)]
        segs, cur = [], []
        for x, y in zip(xs, s.ys):
            ok = y is not None and math.isfinite(y) and (y > 0 or not log_y)
            if ok:
                cur.append(f"{f.px(x):.1f},{f.py(y):.1f}")
            elif cur:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        for seg in segs:
            f.parts.append(f'<polyline class="series" stroke="{color}" points="{" ".join(seg)}"/>')
        # Legend in the top margin, left to right (inside the frame it would cover the curves).
        lx = MARGIN["left"] + sum(34 + 7 * len(t.name) for t in series[:n])
        f.parts.append(f'<line x1="{lx}" y1="10" x2="{lx + 18}" y2="10" stroke="{color}" stroke-width="2.5"/>'
                       f'<text class="legend" x="{lx + 24}" y="14">{escape(s.name)}</text>')
    return f.svg(title)


__all__ = ["Axis", "Point", "Series", "lines", "scatter"]
