"""A native model larger than its GPU streams its layers (dsv4.streamed): the same logits, conversion
records, weight audit and harness records as the model built whole, whatever share of its layers stays
resident; transient layers are rebuilt and dropped (one held at a time); frozen activation scales survive
a rebuild; a CUDA-graph decoder refuses it (the harness: tests/parity/test_streamed_harness.py)."""
from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.streamed import StreamedBlocks, block_bytes, load_streamed_model

IDS = torch.arange(1, 40)


@pytest.fixture(scope="module")
def whole():
    return dsv4.load_model("tiny", backend="emulated", act_scale="frozen")


def test_same_logits_records_and_audit_at_every_budget(whole) -> None:
    from parity.audit import audit_weights

    want, want_short = whole(IDS), whole(IDS[:17])
    sizes = [block_bytes(b) for b in whole.blocks]
    L = len(sizes)
    for budget, resident in ((0, []), (sizes[0] + sizes[1], [0, 1]), (sum(sizes), list(range(L)))):
        m = load_streamed_model("tiny", backend="emulated", act_scale="frozen", resident_bytes=budget)
        assert m.blocks.stats()["builds"] == 0                       # nothing built before a forward
        assert torch.equal(m(IDS), want) and torch.equal(m(IDS[:17]), want_short)
        st = m.blocks.stats()
        assert st["resident_layers"] == resident
        assert st["builds"] == len(resident) + 2 * (L - len(resident))   # transient layers: once a forward
        assert m.describe()["conversions"] == whole.describe()["conversions"]
        assert len(m.conversion_records) == len(whole.conversion_records)
        assert audit_weights(m).summary() == audit_weights(whole).summary()
        m.assert_kernels_ran()


def test_at_most_one_transient_layer_is_held() -> None:
    built: list[int] = []
    alive: dict[int, object] = {}

    class Layer:
        def __init__(self, i):
            self.w = torch.zeros(10)

    def build(i):
        built.append(i)
        return Layer(i)

    import weakref

    blocks = StreamedBlocks(build, 5, resident_bytes=40)       # one 40-byte layer fits
    for i in range(5):
        alive[i] = weakref.ref(blocks[i])
    assert blocks.stats()["resident_layers"] == [0]
    assert [i for i, r in alive.items() if r() is not None] == [0, 4]   # the resident one and the last
    assert blocks[4] is alive[4]() and built == [0, 1, 2, 3, 4]          # held: no rebuild
    blocks[2]
    assert built[-1] == 2 and alive[4]() is None
    with pytest.raises(IndexError, match="layers 0..4"):
        blocks[5]
    with pytest.raises(TypeError, match="layer index"):
        blocks[1:3]
    with pytest.raises(ValueError, match="resident_bytes"):
        StreamedBlocks(build, 5, resident_bytes=-1)


def test_frozen_scales_survive_a_rebuild() -> None:
    m = load_streamed_model("tiny", backend="emulated", act_scale="frozen", resident_bytes=0)
    m(IDS)
    kept = dict(m.blocks._frozen)
    assert kept                                                     # the last layer's are on it still
    m(IDS[:5])                                                      # rebuilt: the first call's scales again
    first = next(iter(kept))
    layer = int(first.split(".")[1])
    lin = [o for o in __import__("dsv4.model", fromlist=["x"]).layer_objects(m.blocks[layer])
           if getattr(o, "name", None) == first][0]
    assert torch.equal(lin.frozen_scale, kept[first])
    m.switch_backend("emulated")
    assert not m.blocks._frozen                                     # a backend switch starts them over


def test_graph_decoder_refuses_a_streamed_model() -> None:
    from dsv4.decode.graphs import GraphDecoder, GraphDecoderError

    m = load_streamed_model("tiny", backend="emulated", resident_bytes=0)
    with pytest.raises(GraphDecoderError, match="streamed"):
        GraphDecoder(m)


def test_decode_steps_match_the_whole_model() -> None:
    whole = dsv4.load_model("tiny", backend="emulated", act_scale="frozen")   # scales frozen on this prompt
    m = load_streamed_model("tiny", backend="emulated", act_scale="frozen", resident_bytes=0)
    a, sa = whole.prefill(IDS[:9])
    b, sb = m.prefill(IDS[:9])
    assert torch.equal(a, b)
    for t in (5, 7, 11):
        assert torch.equal(whole.decode_step(sa, t), m.decode_step(sb, t))


@pytest.mark.gpu
def test_streamed_on_the_gpu_kernel_backend_matches_the_whole_model() -> None:
    """On a GPU with its kernel backend: the same logits as the whole model, every layer built once and
    none kept at a zero budget."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    from parity.threeway import resolve_kernel_backend

    kernel, reason = resolve_kernel_backend("auto", "cuda")
    if kernel is None:
        pytest.skip(f"needs a CUDA GPU with a kernel backend: {reason}")
    whole = dsv4.load_model("tiny", backend=kernel, device="cuda")
    want = whole(IDS.cuda())
    m = load_streamed_model("tiny", backend=kernel, device="cuda", resident_bytes=0)
    assert torch.equal(m(IDS.cuda()), want)
    st = m.blocks.stats()
    assert st["builds"] == len(m.blocks) and st["resident_layers"] == []
