"""Plot labels never overlap: the placer's invariant on crowded inputs, and the drawn SVG's labels
(their estimated boxes; the Chromium test in test_report.py measures the real ones)."""
from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from precision_floor.report.labels import Box, Placer, around, text_box
from precision_floor.report.svg import Point, Series, lines, scatter

TEXT = re.compile(r'<text class="(pt-label|mark-label|budget-label)" x="([\d.-]+)" y="([\d.-]+)"'
                  r'(?: text-anchor="(\w+)")?>([^<]*)</text>')
SIZE = {"pt-label": 10, "mark-label": 10, "budget-label": 11}


def drawn_boxes(svg: str) -> list[Box]:
    return [text_box(float(x), float(y), t, SIZE[c], a or "start") for c, x, y, a, t in TEXT.findall(svg)]


def assert_disjoint(boxes: list[Box]) -> None:
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b, pad=0.0), (a, b)


def test_crowded_points_get_disjoint_labels_or_none():
    pts = [Point(100.0, 0.1, 0.0, f"preset-{i}", "ref") for i in range(20)] + [Point(120.0, 0.2, 0.0, "x", "ref")]
    svg = scatter(pts + [Point(100.0, 0.1, 0.0, "floor", "floor")], x_label="x", y_label="y", title="t",
                  budget_y=0.1)
    boxes = drawn_boxes(svg)
    assert_disjoint(boxes)
    assert 'class="pt-label"' in svg and ">floor</text>" in svg   # the floor's label wins its place
    assert len(boxes) < 23          # some of the twenty stacked presets had no room: dropped, not overlapped


def test_dense_layer_marks_do_not_overlap():
    xs = list(range(400))
    marks = [(i * 3, f"L{i}") for i in range(120)] + [(399, "head")]
    svg = lines(xs, [Series("logic", [1e-3] * 400), Series("floor", [1e-2] * 400)], x_label="probe",
                y_label="1-cos", title="t", x_marks=marks)
    boxes = drawn_boxes(svg)
    assert_disjoint(boxes)
    assert ">L0</text>" in svg and len(boxes) < len(marks)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 700), st.floats(0, 340), st.text("abcxyz-", min_size=1, max_size=14)),
                max_size=30))
def test_placer_never_places_overlapping_boxes(items):
    placer = Placer(Box(0, 0, 760, 380))
    for x, y, t in items:
        placer.place(t, 10, around(x, y))
    for i, a in enumerate(placer.taken):
        for b in placer.taken[i + 1:]:
            assert not a.overlaps(b, pad=0.0)
