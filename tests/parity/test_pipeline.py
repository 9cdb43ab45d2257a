"""Layers pipelined over torchrun ranks (parity/pipeline.py, gloo on CPU) give the one-process
forward bit for bit: logits and every probe, for the reference and the native model; each rank holds
only its own layers; a bad layer plan is bad input naming the plan expected and found. Each launch is
a real ``python -m torch.distributed.run --standalone`` subprocess (~5-8 s on a 2-core box)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4 import probes
from parity.errors import ParityInputError
from parity.pipeline_plan import even_plan, make_plan

CLI = ["-m", "parity.pipeline", "--checkpoint", "tiny", "--backend", "emulated", "--threads", "1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(n: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *CLI, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=ENV)


def one_process(side: str, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The plain single-process prefill (no pipeline code), every probe recorded."""
    if side == "reference":
        import reference

        model = reference.load_model("tiny")
    else:
        import dsv4

        model = dsv4.load_model("tiny", backend="emulated")
    with probes.ProbeRecorder(to_cpu=True) as rec:
        logits = model.prefill(ids)[0]
    return logits, {n: rec.values[n] for n in rec.order}


# (ranks, --layers): the even split, and an uneven one in the device-map-like spelling
LAUNCHES = [(2, '{"embed": 0, "0": 0, "1": 1, "2": 1, "3": 1, "head": 1}', [["embed", 0], [1, 2, 3, "head"]]),
            (3, None, [["embed", 0, 1], [2], [3, "head"]])]


@pytest.mark.parametrize("n,layers,parts", LAUNCHES)
def test_pipelined_forward_equals_one_process_bit_for_bit(tmp_path, tiny, n, layers, parts) -> None:
    out = tmp_path / "pipe.pt"
    r = torchrun(n, "--save", str(out), *(["--layers", layers] if layers else []))
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    got = torch.load(out)
    assert set(got) == {"reference", "native"}
    kinds = [tiny.config.layer_kind(i) for i in range(tiny.config.num_hidden_layers)]
    want_names = probes.probe_names(tiny.config.num_hidden_layers, kinds)
    for side, res in got.items():
        ids = res["ids"]
        assert ids.numel() > 1
        assert res["weights_read"] == parts, side          # each rank read / built only its own layers
        logits, probe_values = one_process(side, ids)
        assert logits.dtype == torch.float32 and res["logits"].shape == logits.shape
        assert torch.equal(res["logits"], logits), side
        assert list(res["probes"]) == list(probe_values), side    # same probes, same (execution) order
        assert set(want_names) <= set(probe_values)               # ... and they are the whole surface
        bad = [k for k, v in probe_values.items() if not torch.equal(res["probes"][k], v)]
        assert not bad, (side, bad[:5])
    assert r.stdout.count("next token") == 2                      # rank 0 reports, once per side


def test_bad_plan_under_torchrun_fails_before_loading(tiny) -> None:
    r = torchrun(2, "--layers", '{"0": [0, 1], "1": [1, 2, 3]}')
    assert r.returncode != 0
    text = " ".join((r.stdout + r.stderr).split())                  # the console wraps long lines
    assert "expected 2 rank(s) 0..1" in text and "found {'0': [0, 1], '1': [1, 2, 3]}" in text
    assert "layer(s) [1] on more than one rank (overlap)" in text
    assert "next token" not in text


def test_plan_for_other_world_size_is_bad_input_exit_2(tiny) -> None:
    r = subprocess.run([sys.executable, *CLI, "--layers", "[[0, 1], [2, 3]]"], capture_output=True, text=True,
                       timeout=120, env=ENV)
    assert r.returncode == 2, r.stdout[-2000:]
    text = " ".join(r.stdout.split())
    assert "expected 1 rank(s) 0..0" in text and "found [[0, 1], [2, 3]]: ranks [0, 1]" in text


# ---- the plan alone (no torch.distributed) ------------------------------------------------------------
def test_even_plan_splits_contiguously_with_sizes_within_one() -> None:
    assert even_plan(4, 1) == {0: [0, 1, 2, 3]}
    assert even_plan(4, 3) == {0: [0, 1], 1: [2], 2: [3]}
    big = make_plan(61, 8).blocks()                                # the real model's 61 layers on 8 GPUs
    assert [len(b) for b in big.values()] == [8, 8, 8, 8, 8, 7, 7, 7]
    assert [x for b in big.values() for x in b] == list(range(61))


def test_plan_spellings_agree_and_ends_hold_embed_and_head() -> None:
    a = make_plan(4, 2, {"0": [0], "1": [1, 2, 3]})
    b = make_plan(4, 2, [[0], [1, 2, 3]])
    c = make_plan(4, 2, json.loads('{"embed": 0, "0": 0, "1": 1, "2": 1, "3": 1, "head": 1}'))
    assert a == b == c
    assert [s.parts for s in a.stages] == [["embed", 0], [1, 2, 3, "head"]]


@pytest.mark.parametrize("spec,size,found", [
    ({0: [0, 1], 1: [1, 2, 3]}, 2, "layer(s) [1] on more than one rank (overlap)"),
    ({0: [0], 1: [2, 3]}, 2, "layer(s) [1] on no rank (gap)"),
    ({0: [0, 2], 1: [1, 3]}, 2, "rank 0's layers [0, 2] not one ascending contiguous block"),
    ({0: [2, 3], 1: [0, 1]}, 2, "blocks out of rank order"),
    ({0: [0, 1, 2, 3], 1: []}, 2, "rank(s) [1] without layers"),
    ({0: [0, 1], 2: [2, 3]}, 2, "ranks [0, 2]"),
    ([[0, 1], [2, 3, 4]], 2, "[4] not layer indices 0..3"),
    ({0: 0, 1: 1, 2: 1, 3: 1, "head": 0}, 2, "expected 'head' on rank 1 (the last rank), found it on rank 0"),
    ({0: [0], 1: [1], 2: [2], 3: [3], 4: []}, 5, "expected 1..4 ranks (at least one layer each, num_hidden_layers=4), "
                                                 "found 5 ranks"),
])
def test_bad_plan_is_one_error_naming_expected_and_found(spec, size, found) -> None:
    with pytest.raises(ParityInputError) as e:
        make_plan(4, size, spec)
    msg = str(e.value)
    assert found in msg
    if size == 2 and "on rank" not in found:
        assert "expected 2 rank(s) 0..1" in msg and repr(spec) in msg and "{0: [0, 1], 1: [2, 3]}" in msg


def test_native_model_built_for_a_share_refuses_the_rest(tiny) -> None:
    import dsv4

    m = dsv4.load_model("tiny", backend="emulated", only=[1, "head"])
    assert [b is not None for b in m.blocks] == [False, True, False, False] and m.embed_weight is None
    state = m.new_state(torch.tensor([1, 2, 3]))
    X = torch.zeros(3, m.config.hc_mult, m.config.hidden_size)
    with pytest.raises(ValueError, match=r"layer 0: expected a part this model built"):
        m.layer(0, X, state)
    with pytest.raises(ValueError, match="embed"):
        m.embed(torch.tensor([1, 2, 3]))
    assert m.layer(1, X, state).shape == X.shape
    with pytest.raises(ValueError, match=r"only: expected layer indices 0..3"):
        dsv4.load_model("tiny", backend="emulated", only=[7])
