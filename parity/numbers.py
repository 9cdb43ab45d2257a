"""One number formatter for every table, line and report of the project: ``digits`` significant
figures, counts as integers, no padding zeros ("361", not "361.0000"; "0.0021", not "0.0021000"),
similarities near 1 with the significant figures of their distance from 1 ("0.9997045"), an
exponent only outside [1e-3, 1e5)."""
from __future__ import annotations

import math
from typing import Any


def sig(v: Any, digits: int = 4) -> str:
    if v is None or isinstance(v, str):
        return "—" if v is None else v
    if isinstance(v, bool):
        return str(v).lower()
    v = float(v)
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    a = abs(v)
    if v.is_integer() and a < 1e15:
        return str(int(v))
    if a < 1e-3 or a >= 1e5:
        return f"{v:.{max(digits - 1, 0)}e}"
    if 0.9 < a < 1:   # a similarity: what matters is how far from 1 it is
        decimals = min(digits - 1 - math.floor(math.log10(1 - a)), 12)
        return f"{v:.{decimals}f}".rstrip("0")
    s = f"{v:.{digits}g}"
    return f"{v:.0f}" if "e" in s else s


def pm(v: Any, se: Any, digits: int = 4) -> str:
    """``value ± se`` (two significant figures for the SE; omitted when unknown)."""
    if se is None or (isinstance(se, float) and math.isnan(se)) or sig(v) == "—":
        return sig(v, digits)
    return f"{sig(v, digits)} ± {sig(se, 2)}"
