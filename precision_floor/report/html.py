"""Small HTML building blocks: escaping, number formats, tables from row dicts, sections."""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any, Callable, Iterable, Mapping, Sequence


def esc(v: Any) -> str:
    return escape("" if v is None else str(v))


def isnum(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def num(v: Any, digits: int = 4) -> str:
    """The project's one number format (parity.numbers.sig), with typographic infinities."""
    from parity.numbers import sig

    return {"inf": "∞", "-inf": "−∞"}.get(s := sig(v, digits), s)


def pm(v: Any, se: Any, digits: int = 4) -> str:
    if not isnum(v):
        return num(v, digits)
    if not isnum(se):
        return num(v, digits)
    return f"{num(v, digits)} <span class=se>± {num(se, 2)}</span>"


def kib(n: Any) -> str:
    return "—" if n is None else f"{int(n) / 1024:,.1f} KiB"


def signed_kib(n: Any) -> str:
    return "—" if n is None else f"{int(n) / 1024:+,.1f} KiB"


@dataclass(frozen=True)
class Col:
    header: str
    key: str
    fmt: Callable[[Any, Mapping[str, Any]], str] | None = None   # (value, row) -> HTML (already escaped)
    align: str = "right"
    title: str = ""


def table(rows: Iterable[Mapping[str, Any]], cols: Sequence[Col], *, cls: str = "",
          row_cls: Callable[[Mapping[str, Any]], str] | None = None, caption: str = "") -> str:
    head = "".join(f'<th class="{c.align}"' + (f' title="{esc(c.title)}"' if c.title else "") + f">{esc(c.header)}</th>"
                   for c in cols)
    body = []
    for r in rows:
        rc = row_cls(r) if row_cls else ""
        cells = []
        for c in cols:
            v = r.get(c.key)
            html = c.fmt(v, r) if c.fmt else (num(v) if isnum(v) and isinstance(v, float) else esc(v))
            cells.append(f'<td class="{c.align}">{html}</td>')
        body.append(f'<tr class="{rc}">' + "".join(cells) + "</tr>" if rc else "<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f'<table class="{cls}">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def kv_table(items: Iterable[tuple[str, str]], cls: str = "kv") -> str:
    """Two columns: escaped key, value already HTML."""
    return f'<table class="{cls}"><tbody>' + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items) \
        + "</tbody></table>"


def section(sid: str, title: str, body: str, intro: str = "") -> str:
    from .studies import regenerate_command

    p = f'<p class="intro">{intro}</p>' if intro else ""
    cmd = regenerate_command(sid)
    regen = (f'<p class="regen">Regenerate: <code>{esc(cmd)}</code> (DIR = the store), then <code>python -m '
             f'precision_floor.report --records DIR --out FILE</code>, which also runs it when the study is '
             f'absent.</p>') if cmd else ""
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>{p}{body}{regen}</section>'


def note(text: str, kind: str = "note") -> str:
    return f'<p class="{kind}">{text}</p>'


def bar(value: float, se: float | None, scale: float) -> str:
    """A signed horizontal bar (value / scale of half the width) with an SE whisker, as inline SVG."""
    if not isnum(value) or scale <= 0:
        return ""
    w, mid = 120, 60
    x = max(-1.0, min(1.0, value / scale)) * (mid - 2)
    left, width = (mid + x, -x) if x < 0 else (mid, x)
    cls = "neg" if value < 0 else "pos"
    whisker = ""
    if isnum(se) and se:
        a = mid + max(-1.0, min(1.0, (value - se) / scale)) * (mid - 2)
        b = mid + max(-1.0, min(1.0, (value + se) / scale)) * (mid - 2)
        whisker = f'<line class="whisker" x1="{a:.1f}" y1="7" x2="{b:.1f}" y2="7"/>'
    return (f'<svg class="bar" viewBox="0 0 {w} 14" width="{w}" height="14"><line class="zero" x1="{mid}" y1="0" '
            f'x2="{mid}" y2="14"/><rect class="{cls}" x="{left:.1f}" y="3" width="{max(width, 0.5):.1f}" '
            f'height="8"/>{whisker}</svg>')


__all__ = ["Col", "bar", "esc", "isnum", "kib", "kv_table", "note", "num", "pm", "section", "signed_kib", "table"]
