"""Tables survive a pipe and a narrow terminal; long work prints plain progress lines without a TTY."""
from __future__ import annotations

import io

from parity.bugzoo.registry import list_faults
from parity.console import PlainProgress, make_console


def _fault_list(width: int | None, monkeypatch) -> str:
    from parity.bugzoo.render import fault_list

    if width is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(width))
    buf = io.StringIO()
    fault_list(make_console(file=buf), list_faults())
    return buf.getvalue()


def test_fault_names_are_intact_piped_and_at_60_columns(monkeypatch):
    names = [f.name for f in list_faults()]
    for width in (None, 60):
        out = _fault_list(width, monkeypatch)
        assert all(n in out for n in names), width          # no cell cut or shredded
        assert "…" not in out
        if width:
            assert max(len(line) for line in out.splitlines()) <= 60


def test_plain_progress_lines_have_time_and_eta():
    buf = io.StringIO()
    p = PlainProgress(buf)
    p.update("decode", 1, 300)
    p.update("decode", 2, 300)      # within the interval: not printed
    p.last["decode"] -= 10.0        # an interval later
    p.update("decode", 3, 300)
    p.update("decode", 300, 300)    # the last always is
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and "decode: 3/300" in lines[0] and "eta" in lines[0] and "done" in lines[1]
