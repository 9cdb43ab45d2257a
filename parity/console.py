"""Output that survives a pipe and a narrow terminal.

* ``make_console()``: a rich Console whose tables never cut a cell (every column folds long words
  instead of an ellipsis), full width (200) when stdout is not a terminal and COLUMNS is unset.
* ``PlainProgress``: when stderr is not a terminal, long work prints plain timestamped lines
  (at most one per description every few seconds, and the last) with an ETA, instead of nothing.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 200
PLAIN_EVERY_SECONDS = 5.0


def _fold(obj: Any) -> None:
    if isinstance(obj, Table):
        for col in obj.columns:
            col.overflow = "fold"
            col.no_wrap = False
            for cell in col._cells:
                _fold(cell)
    for attr in ("renderables", "renderable"):   # Group, Panel, Padding
        inner = getattr(obj, attr, None)
        if isinstance(inner, (list, tuple)):
            for r in inner:
                _fold(r)
        elif inner is not None and inner is not obj:
            _fold(inner)


def _plain(cell: Any) -> str:
    return cell.plain if hasattr(cell, "plain") else str(cell)


def long_layout(table: Table) -> Text:
    """A table as one block per row (``column: value`` lines): readable at any width."""
    out = Text()
    if table.title:
        out.append(_plain(table.title) + "\n", style="bold")
    cols = table.columns
    for r in range(table.row_count):
        cells = [_plain(c._cells[r]) if r < len(c._cells) else "" for c in cols]
        out.append(f"- {_plain(cols[0].header)}: {cells[0]}\n")
        for col, v in zip(cols[1:], cells[1:]):
            out.append(f"    {_plain(col.header)}: {v}\n")
    return out


class IntactConsole(Console):
    """Console.print where no table cuts a cell: columns fold long words, and a table too wide for
    the terminal (wider than its natural width allows) is printed in the long layout."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        objs = []
        for o in objects:
            if isinstance(o, Table) and len(o.columns) > 2 and self._too_wide(o):
                o = long_layout(o)
            _fold(o)
            objs.append(o)
        super().print(*objs, **kwargs)

    def _too_wide(self, table: Table) -> bool:
        # the widest column's longest word plus borders must fit, or the columns shred into letters
        need = sum(max([len(w) for c in [col.header, *col._cells] for w in _plain(c).split()] or [1]) + 3
                   for col in table.columns)
        return need > self.width


def make_console(**kwargs: Any) -> IntactConsole:
    stream = kwargs.get("file") or (sys.stderr if kwargs.get("stderr") else sys.stdout)
    if not stream.isatty() and "COLUMNS" not in os.environ and "width" not in kwargs:
        kwargs["width"] = PIPE_WIDTH
    return IntactConsole(**kwargs)


class PlainProgress:
    """``update(description, done, total)`` printing plain lines to ``stream``."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.start: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def update(self, description: str, done: int, total: int) -> None:
        now = time.monotonic()
        t0 = self.start.setdefault(description, now)
        self.last.setdefault(description, now)   # the first line comes after an interval, or at the end
        if done < total and now - self.last[description] < PLAIN_EVERY_SECONDS:
            return
        self.last[description] = now
        eta = (now - t0) / done * (total - done) if done else float("nan")
        tail = "done" if done >= total else (f"eta {eta:.0f} s" if eta == eta else "eta ?")
        print(f"[{time.strftime('%H:%M:%S')}] {description}: {done}/{total} ({now - t0:.0f} s, {tail})",
              file=self.stream, flush=True)
