"""Where in ``dsv4/`` something happened: the innermost stack frame inside the package.

A host sync or a failed capture is raised deep inside torch; what a developer needs is the line of
*our* code that asked for it. Pure functions over ``traceback.FrameSummary`` lists (unit-tested on
the CPU with synthetic stacks).
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

PACKAGE_ROOT = Path(__file__).resolve().parents[1]          # .../dsv4
# Frames of the tools that observe a step are never the culprit.
OBSERVERS = ("decode/readiness.py", "decode/optrace.py", "decode/where.py", "decode/graphs.py")


@dataclass(frozen=True)
class Location:
    path: str        # relative to the package's parent, e.g. "dsv4/layers/attention.py"
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.function})"


def _relative(filename: str, root: Path) -> str | None:
    """``root.name/...`` for a file inside ``root``, else None."""
    try:
        return (Path(root.name) / Path(filename).resolve().relative_to(root.resolve())).as_posix()
    except ValueError:
        return None


def package_frames(stack: Iterable[traceback.FrameSummary], root: Path = PACKAGE_ROOT,
                   skip: Sequence[str] = OBSERVERS) -> list[Location]:
    """The frames of ``stack`` (outermost first) that lie inside ``root``, observers excluded."""
    out = []
    for fr in stack:
        rel = _relative(fr.filename, root)
        if rel is None or any(rel.endswith(s) for s in skip):
            continue
        out.append(Location(rel, int(fr.lineno or 0), fr.name, (fr.line or "").strip()))
    return out


def source_location(stack: Iterable[traceback.FrameSummary], root: Path = PACKAGE_ROOT,
                    skip: Sequence[str] = OBSERVERS) -> Location | None:
    """The innermost frame inside ``root`` (the line of our code nearest to the event), or None."""
    frames = package_frames(stack, root, skip)
    return frames[-1] if frames else None


def exception_location(exc: BaseException, root: Path = PACKAGE_ROOT) -> Location | None:
    return source_location(traceback.extract_tb(exc.__traceback__), root)


def first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return f"{type(exc).__name__}: {msg[:limit]}"
