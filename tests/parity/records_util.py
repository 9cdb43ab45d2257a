"""Build schema-valid records for tests without running a model."""
from __future__ import annotations

from typing import Any

from parity.records import RunContext


def ctx(**over: Any) -> RunContext:
    base = dict(run_id="r1", code_version="test", checkpoint_fingerprint="f" * 64, config_name="tiny",
                plan="default", profile="bf16", backend="emulated", device="cpu", versions={"torch": "x"}, seed=0)
    base.update(over)
    return RunContext(**base)


def rec(probe: str, metric: str, value: float, *, pair: str = "floor", mode: str = "isolated",
        prompt: str = "p1", context: RunContext | None = None, **ctx_over: Any) -> dict[str, Any]:
    c = context or ctx(**ctx_over)
    return c.record(prompt_id=prompt, prompt_mode="chat", pair=pair, compare_mode=mode, probe=probe, metric=metric,
                    value=value)
