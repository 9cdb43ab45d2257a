"""Pre-flight without a GPU: compile every CuTe DSL kernel for one arch and census its PTX.

    python -m dsv4.kernels.compile_check --arch sm_90a|sm_100a [--only NAME ...]

Prints one row per kernel (compile time, count of every required / forbidden PTX pattern) and exits
non-zero if any kernel fails to compile, lacks a required instruction or contains a forbidden one
(e.g. an sm_100 ``cvt...e2m1x2`` in sm_90a code).
"""
from __future__ import annotations

import argparse
import re
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

ARCHES = ("sm_90a", "sm_100a")


def collect(arch: str) -> list:
    """All builds for ``arch``: the arch package's GEMMs (generic, decode route), the shared activation quantizer."""
    from .cutedsl.act_quant_host import act_quant_builds
    from .cutedsl.common import KernelBuild

    builds = []
    try:
        if arch == "sm_90a":
            from .cutedsl.sm90 import compile_for_check
            from .cutedsl.sm90.decode_compile import decode_builds
        else:
            from .cutedsl.sm100 import compile_for_check
            from .cutedsl.sm100.decode_compile import decode_builds
        builds += compile_for_check() + decode_builds()   # the generic kernels, then the decode route's
    except Exception as e:  # an arch package that does not import is a failed pre-flight
        builds.append(KernelBuild(f"{arch} package", arch, "", 0.0, error=f"{type(e).__name__}: {e}"))
    return builds + act_quant_builds(arch)


def _label(pattern: str, width: int = 56) -> str:
    """A regex shown as the instruction it matches (escapes dropped), shortened for the table."""
    text = re.sub(r"\\(.)", r"\1", pattern.replace("\\d+", "N"))
    return text if len(text) <= width else text[: width - 1] + "…"


def render(builds: list, console: Console) -> bool:
    table = Table(title="CuTe DSL pre-flight", show_lines=False)
    for col in ("kernel", "arch", "compile s", "PTX census", "status"):
        table.add_column(col)
    ok_all = True
    for b in builds:
        probs = b.problems()
        ok_all &= not probs
        census = "" if b.error else "\n".join(escape(f"{_label(p)} = {c}") for p, c in b.census().items())
        status = "[green]ok[/green]" if not probs else "[red]" + escape("; ".join(probs)[:300]) + "[/red]"
        table.add_row(b.name, b.arch, f"{b.seconds:.2f}", census, status)
    console.print(table)
    return ok_all


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=ARCHES, required=True)
    ap.add_argument("--only", nargs="*", help="kernel names to keep (default: all)")
    args = ap.parse_args(argv)
    console = Console(width=180)
    builds = collect(args.arch)
    if args.only:
        builds = [b for b in builds if b.name in args.only]
    ok = render(builds, console)
    n_bad = sum(not b.ok for b in builds)
    console.print(f"{len(builds)} kernels, {n_bad} failed" if n_bad else f"{len(builds)} kernels ok")
    return 0 if ok and builds else 1


if __name__ == "__main__":
    sys.exit(main())
