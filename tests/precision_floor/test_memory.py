"""Weight bytes per plan: hand-computed format sizes, per-class sums, agreement with the harness's
dry-run accounting."""
from __future__ import annotations

import pytest

from dsv4.config import layer_devices
from dsv4.plan import PRESETS, PrecisionPlan
from parity.memory import model_weights
from precision_floor.memory import UNPLANNED, bytes_vs, class_bytes_table, format_bytes, plan_bytes, \
    plan_bytes_by_class


def test_format_bytes_by_hand() -> None:
    # NVFP4 [512, 256]: packed 512*128 + E4M3 scales 512*16 + two fp32 scalars.
    assert format_bytes("fp4", (512, 256)) == 512 * 128 + 512 * 16 + 8
    # FP8 block [256, 256]: 256*256 bytes + a 2x2 grid of fp32 block scales.
    assert format_bytes("fp8", (256, 256)) == 256 * 256 + 4 * 4
    assert format_bytes("bf16", (3, 5)) == 30


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_totals_agree_with_the_harness_dry_run(tiny, preset: str) -> None:
    c = tiny.config
    plan = PrecisionPlan.preset(preset)
    assert plan_bytes(c, plan) == model_weights(c, layer_devices(c, "cpu", None), plan).total


def test_one_flip_changes_exactly_its_class(tiny) -> None:
    c = tiny.config
    table = class_bytes_table(c)
    base = PrecisionPlan.preset("all-fp4")
    for cls in ("lm_head", "routed_experts", "indexer_weights"):
        flipped = base.replace(**{cls: "bf16"})
        assert plan_bytes(c, flipped) - plan_bytes(c, base) == table.loc[cls, "bf16"] - table.loc[cls, "fp4"]
        a, b = plan_bytes_by_class(c, base), plan_bytes_by_class(c, flipped)
        assert [k for k in a if a[k] != b[k]] == [cls]
    assert plan_bytes_by_class(c, base)[UNPLANNED] > 0


def test_bytes_vs_all_fp4(tiny) -> None:
    r = bytes_vs(tiny.config, PrecisionPlan.preset("all-bf16"))
    assert r["extra_bytes"] > 0 and r["ratio"] == pytest.approx(r["bytes"] / r["base_bytes"])
    assert bytes_vs(tiny.config, PrecisionPlan.preset("all-fp4"))["extra_bytes"] == 0
