"""The decode op counter (benchmarks/count_decode_ops.py): a linear call counts as the launches given,
its emulated insides not at all, and the layers' __call__ are restored afterwards."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from count_decode_ops import _linear_classes, count  # noqa: E402


def test_linear_calls_count_as_kernel_launches_and_none_is_in_the_attention_core():
    before = {c: vars(c)["__call__"] for c in _linear_classes()}
    zero = count("tiny", "default", "emulated", steps=2, prompt=20, linear_launches=0)
    two = count("tiny", "default", "emulated", steps=2, prompt=20, linear_launches=2)
    assert {c: vars(c)["__call__"] for c in _linear_classes()} == before
    a, b = zero["ops_per_step"], two["ops_per_step"]
    assert set(a) == {"embed", "attn_pre", "attn_core", "attn_out", "dispatch", "ffn", "head"}
    # attn_pre projects q, kv and the compressors / indexer inputs: 2 launches more per linear call
    assert b["attn_pre"] - a["attn_pre"] >= 2 * 3 * zero["layers"]
    assert b["head"] - a["head"] == 2           # the LM head: one linear call
    assert b["attn_core"] == a["attn_core"] > 0  # no linear layer runs in the eager core
    assert two["eager_ops_per_step"] == b["embed"] + b["attn_core"]


def test_the_decode_bench_divides_the_graph_steps_host_time_by_its_eager_launches():
    import bench_decode_graphs

    row = {"config": "tiny", "ms_per_step": {"graph": 9.0}, "device_work": {"graph": {"kernel_ms_per_step": 4.0}}}
    out = bench_decode_graphs.with_launch_count(row)
    n = count("tiny", "default", "emulated", steps=8, prompt=64)["eager_ops_per_step"]
    assert out["eager_launches_per_step"] == n > 0
    assert out["host_per_eager_launch_us"] == (9.0 - 4.0) * 1e3 / n
    assert {k: out[k] for k in row} == row
