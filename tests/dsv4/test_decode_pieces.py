"""The decode step cut into graph-capturable and eager pieces (dsv4.decode.pieces) reproduces
``NativeModel.decode_step`` bit for bit: the CPU half of the CUDA-graph decoder's correctness (the
graphs replay these same pieces). Crosses window wrap-around and CSA/HCA block closes."""
from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.decode.graphs import GraphDecoder, bitwise_equal
from dsv4.decode.pieces import Buffers, GraphDecoderError, PieceRunner, build_pieces, StepInput

PROMPT = (torch.arange(40, dtype=torch.int64) * 11 + 2) % 512


def _compare(model, steps: int) -> None:
    with torch.no_grad():
        le, se = model.prefill(PROMPT)
        _, sp = model.prefill(PROMPT)
        runner = PieceRunner(model)
        tok = int(le[-1].argmax())
        for s in range(steps):
            a = model.decode_step(se, tok)
            b = runner.step(sp, tok)
            assert bitwise_equal(a, b), f"step {s}: max |diff| {float((a - b).abs().max())}"
            assert [lc.length for lc in sp.layers] == [lc.length for lc in se.layers] == [se.pos] * len(se.layers)
            tok = int(a.argmax())


@pytest.mark.parametrize("plan", ["default", "all-bf16", "all-fp4"])
def test_pieces_equal_decode_step(plan: str) -> None:
    torch.set_num_threads(1)
    # 40 + 24 steps: the 16-slot window wraps, CSA (4) and HCA (16) blocks close during decode
    _compare(dsv4.load_model("tiny", plan=plan, backend="emulated"), 24)


def test_pieces_across_two_device_names_transfer_the_streams_once() -> None:
    # "cpu" and "cpu:0" are two device names to the device map: the piece list gets the transfer a
    # two-GPU map needs (layers 2-3 and the head on the second device), and stays exact
    m = dsv4.load_model("tiny", plan="all-bf16", backend="emulated", device_map={2: "cpu:0", 3: "cpu:0",
                                                                                  "head": "cpu:0"})
    pieces = build_pieces(m, Buffers(), StepInput())
    names = [p.name for p in pieces]
    assert names[0] == "embed" and names[-1] == "head"
    assert names[1:6] == ["L0.attn_pre", "L0.attn_core", "L0.attn_out", "L0.dispatch", "L0.ffn"]
    transfers = [p for p in pieces if "->" in p.name]
    assert [(p.name, p.key, p.src_key, p.graphable) for p in transfers] == [("X2->cpu:0", 2, 1, False)]
    assert names.index("X2->cpu:0") == names.index("L2.attn_pre") - 1
    _compare(m, 3)


def test_only_the_embedding_and_attention_core_pieces_are_eager() -> None:
    m = dsv4.load_model("tiny", plan="all-bf16", backend="emulated")
    eager = [p.name for p in build_pieces(m, Buffers(), StepInput()) if not p.graphable]
    assert eager == ["embed"] + [f"L{i}.attn_core" for i in range(4)]


def test_the_eager_attention_core_projects_nothing_and_decodes_only_new_rows(monkeypatch) -> None:
    """The new token's own work runs in the captured attn_pre / attn_out: inside the eager attention core no
    linear layer is called and the KV storage decodes only the rows a step adds (at most one closed block
    per compressor), never a whole window or cache again. Before, every step
    decoded the window (up to 16 rows here) and the compressed cache, and projected for the compressors
    and the indexer there."""
    from dsv4.layers.kv_cache import Fp8KVStorage
    from dsv4.layers.linear import Linear

    torch.set_num_threads(1)
    m = dsv4.load_model("tiny", plan="default", backend="emulated")
    seen: dict[str, list] = {"linear": [], "decoded_rows": []}
    inside = [False]

    def spy(kind, fn, rows=False):
        def wrapped(self, x, *a, **k):
            if inside[0]:
                seen[kind].append(int(x.parts["nope"].shape[0]) if rows else 1)
            return fn(self, x, *a, **k)
        return wrapped

    for cls in (Linear, *Linear.__subclasses__()):     # each precision's linear has its own __call__
        if "__call__" in vars(cls):
            monkeypatch.setattr(cls, "__call__", spy("linear", vars(cls)["__call__"]))
    monkeypatch.setattr(Fp8KVStorage, "decode", spy("decoded_rows", Fp8KVStorage.decode, rows=True))

    class Spying(PieceRunner):
        def run_piece(self, p):
            inside[0] = p.name.endswith("attn_core")
            try:
                super().run_piece(p)
            finally:
                inside[0] = False

    with torch.no_grad():
        le, st = m.prefill(PROMPT)
        runner, tok = Spying(m), int(le[-1].argmax())
        for _ in range(20):                      # crosses CSA (4) and HCA (16) block closes
            tok = int(runner.step(st, tok).argmax())
    assert seen["linear"] == [], seen
    assert seen["decoded_rows"] and max(seen["decoded_rows"]) == 1, seen["decoded_rows"]


def test_buffers_keep_their_storage_and_reject_a_changed_shape() -> None:
    b = Buffers()
    b.put("x", torch.ones(3))
    addr = b["x"].data_ptr()
    b.put("x", torch.full((3,), 2.0))
    assert b["x"].data_ptr() == addr and torch.equal(b["x"], torch.full((3,), 2.0))
    with pytest.raises(GraphDecoderError, match=r"buffer x: expected torch.float32 \(3,\)"):
        b.put("x", torch.ones(4))


def test_graph_decoder_explains_that_it_needs_cuda() -> None:
    m = dsv4.load_model("tiny", plan="all-bf16", backend="emulated")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the CPU refusal is not reachable here")
    with pytest.raises(GraphDecoderError, match="expected a CUDA device"):
        GraphDecoder(m)


def test_bitwise_equal_sees_signed_zero_and_nan_payloads() -> None:
    assert bitwise_equal(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not bitwise_equal(torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([1.0]))


def test_the_decode_benchmark_breakdown_sums_every_piece_kind_once_per_step() -> None:
    """benchmarks/bench_decode_graphs.py's "where an eager step goes" table, run on the CPU: every
    piece kind is timed, the eager-by-design kinds are exactly those the graph decoder leaves eager,
    and the two shares add up to the step."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_decode_graphs

    torch.set_num_threads(1)
    model = dsv4.load_model("tiny", backend="emulated")
    with torch.no_grad():
        logits, state = model.prefill(PROMPT)
        toks = [int(logits[-1].argmax())]
        for _ in range(4):
            toks.append(int(model.decode_step(state, toks[-1]).argmax()))
        out = bench_decode_graphs.breakdown(model, PROMPT, toks, 1, torch.device("cpu"))
    ms = out["ms_per_step_by_piece"]
    assert set(ms) == {"embed", "attn_pre", "attn_core", "attn_out", "dispatch", "ffn", "head"}
    assert all(v > 0 for v in ms.values())
    eager_kinds = {k for k, g in out["graphable"].items() if not g}
    assert eager_kinds == {"embed", "attn_core"}
    assert out["eager_by_design_ms"] + out["graphable_ms"] == pytest.approx(sum(ms.values()))
