"""Ops a native decode step launches, per piece kind, counted on the CPU (no GPU needed).

On a GPU every op outside the views is a kernel launch, and the CUDA-graph decoder replays all pieces but
the embedding and the attention cores (``dsv4.decode.pieces``): the cores' ops are launched from Python at
every step, and their count is what keeps a graph step's wall time above its device time (issue #43's
decode target). The pieces run eagerly here (``PieceRunner``) under ``dsv4.decode.optrace.OpTracer``; ops
that only make views (reshape, slice, permute, ...) or allocate are not counted. Per kind: ops per step,
averaged over ``--steps`` steps after a ``--prompt``-token prefill (the steps cross compressor block
closes, which add a few ops). A linear layer's call counts as ``--linear-launches`` (default 2: the
kernel backends quantize the activation, then run the GEMM) whatever the emulated backend runs inside it,
so the counts are those of a kernel backend with the default plan's numerics everywhere else.

    python benchmarks/count_decode_ops.py [--checkpoint tiny] [--plan default] [--steps 16] [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ATen ops that make a view or an uninitialized tensor: no kernel launch
NO_LAUNCH = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze",
             "select", "slice", "detach", "alias", "as_strided", "unbind", "split", "split_with_sizes", "chunk",
             "narrow", "unflatten", "flatten", "empty", "empty_strided", "empty_like", "view_as_real",
             "view_as_complex", "_reshape_alias", "diagonal", "movedim", "unfold"}


def launches(events: list[Any]) -> int:
    return sum(e.op.split(".")[1] not in NO_LAUNCH for e in events)


def _linear_classes() -> list[type]:
    from dsv4.layers.grouped_linear import GroupedLinear
    from dsv4.layers.linear import Linear

    out = []
    for base in (Linear, GroupedLinear):
        out += [c for c in (base, *base.__subclasses__()) if "__call__" in vars(c)]
    return out


def count(checkpoint: str, plan: str, backend: str, steps: int, prompt: int, linear_launches: int = 2
          ) -> dict[str, Any]:
    import torch

    import dsv4
    from dsv4.decode.optrace import OpTracer
    from dsv4.decode.pieces import PieceRunner

    model = dsv4.load_model(checkpoint, plan=plan, backend=backend, device="cpu")
    per: Counter = Counter()
    layers = len(model.blocks)
    linears: list[int] = []    # [calls] inside a counted piece, [calls, 0] inside a counted call, else []

    def as_kernel_call(fn: Any) -> Any:
        def call(self: Any, *a: Any, **k: Any) -> Any:
            if len(linears) != 1:
                return fn(self, *a, **k)
            linears[0] += 1                   # its insides are not traced: one kernel backend call
            linears.append(0)
            try:
                with torch.utils._python_dispatch._disable_current_modes():
                    return fn(self, *a, **k)
            finally:
                linears.pop()
        return call

    class Counting(PieceRunner):
        def run_piece(self, p: Any) -> None:
            linears[:] = [0]
            try:
                with OpTracer() as t:
                    super().run_piece(p)
            finally:
                n = linears.pop()
            per[p.name.rsplit(".", 1)[-1]] += launches(t.events) + linear_launches * n

    saved = {c: vars(c)["__call__"] for c in _linear_classes()}
    for c, fn in saved.items():
        setattr(c, "__call__", as_kernel_call(fn))

    try:
        with torch.no_grad():
            logits, state = model.prefill((torch.arange(prompt, dtype=torch.int64) * 7 + 3) % model.config.vocab_size)
            runner, tok = Counting(model), int(logits[-1].argmax())
            for _ in range(steps):
                tok = int(runner.step(state, tok).argmax())
    finally:
        for c, fn in saved.items():
            setattr(c, "__call__", fn)
    ops = {k: v / steps for k, v in per.items()}
    eager = sum(v for k, v in ops.items() if k in ("embed", "attn_core"))
    return {"bench": "count_decode_ops", "checkpoint": checkpoint, "plan": plan, "backend": backend,
            "layers": layers, "steps": steps, "prompt_tokens": prompt, "linear_launches": linear_launches,
            "ops_per_step": ops,
            "eager_ops_per_step": eager, "graphed_ops_per_step": sum(ops.values()) - eager,
            "attn_core_ops_per_layer": ops.get("attn_core", 0.0) / layers}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="tiny")
    p.add_argument("--plan", default="default")
    p.add_argument("--backend", default="emulated")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--linear-launches", type=int, default=2, help="launches a linear layer's call counts as")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.steps < 1 or a.prompt < 1 or a.linear_launches < 0:
        p.error(f"--steps / --prompt / --linear-launches: expected >= 1 / >= 1 / >= 0, found {a.steps} / "
                f"{a.prompt} / {a.linear_launches}")
    r = count(a.checkpoint, a.plan, a.backend, a.steps, a.prompt, a.linear_launches)
    for k, v in r["ops_per_step"].items():
        print(f"{k:10s} {v:8.1f} ops/step")
    print(f"eager (embed + attention cores): {r['eager_ops_per_step']:.1f} ops/step, "
          f"{r['attn_core_ops_per_layer']:.1f} per layer's core; replayed: {r['graphed_ops_per_step']:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
