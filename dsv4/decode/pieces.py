"""One native decode step, cut into pieces at the points that cannot live in a CUDA graph.

``NativeModel.decode_step`` is one Python call; this module re-expresses it as a list of
:class:`Piece` s that read and write named tensors in a :class:`Buffers` table, calling the model's
own layer methods in the order ``Block.__call__`` / ``Attention.__call__`` / ``MoE.__call__`` do.
``tests/dsv4/test_decode_pieces.py`` checks on the CPU that the pieces reproduce ``decode_step`` bit
for bit (every plan), so a change to those methods that this file does not follow fails a test
instead of drifting; the GPU tests check the same through graphs.

Per layer i (``G`` = capturable, ``E`` = eager):

* ``L{i}.attn_pre``  G  mHC mix + collapse, attn_norm, q / kv projections, RoPE at the static position,
  and the rest of the new token's own work: its window row encoded and decoded, the compressors' projections, the
  indexer's treated query and head weights
* ``L{i}.attn_core`` E  window ring, compressor pooling, indexer scores and top-k, sparse softmax: the
  cache sizes grow with the position (no host read: ``attend`` takes its window bounds from
  the host's ``start``)
* ``L{i}.attn_out``  G  inverse RoPE, grouped output projection, mHC post, mHC mix + collapse, ffn_norm, router
* ``L{i}.dispatch``  G  MoE dispatch: stable argsort, expert counts by a scatter, offsets
* ``L{i}.ffn``       G  experts (grouped GEMMs on the offsets), shared expert, mHC post
* ``embed`` E (the token id comes from the host), ``head`` G; ``X{i}@dev`` transfers (E) where
  consecutive layers sit on different devices.

What changes from step to step enters through static tensors filled before the pieces run: the
token id and the position on every device (``tok@dev``, ``pos@dev``). Python integers derived from
the position are used only in eager pieces, so no graph bakes one in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..layers.norm import NormedInput, take_rows

INDEXER_PREPARED = ("i.q", "i.w", "i.kv", "i.gate")   # Indexer.prepare's outputs, in order


class GraphDecoderError(RuntimeError):
    """The CUDA-graph decoder cannot run as asked (no CUDA, a mismatched device, probes active...)."""


class Buffers:
    """Named tensors shared by the pieces. ``put`` keeps a name's storage once it exists (graphs
    captured later read that address): new values are copied in, never rebound."""

    def __init__(self) -> None:
        self.t: dict[str, torch.Tensor] = {}
        self.overlay: dict[str, torch.Tensor] | None = None   # reads/writes of an uncaptured reference run

    def __getitem__(self, name: str) -> torch.Tensor:
        if self.overlay is not None and name in self.overlay:
            return self.overlay[name]
        return self.t[name]

    def bind(self, name: str, value: torch.Tensor) -> None:
        """Rebind (graph outputs at capture, warm-up outputs)."""
        if self.overlay is not None:
            self.overlay[name] = value
        else:
            self.t[name] = value

    def put(self, name: str, value: torch.Tensor) -> None:
        """Store an eager piece's output in place (an owned copy the first time)."""
        if self.overlay is not None:
            self.overlay[name] = value
            return
        old = self.t.get(name)
        if old is None:
            self.t[name] = value.detach().clone()
            return
        if old.shape != value.shape or old.dtype != value.dtype or old.device != value.device:
            raise GraphDecoderError(f"buffer {name}: expected {old.dtype} {tuple(old.shape)} on {old.device} every "
                                    f"step, found {value.dtype} {tuple(value.shape)} on {value.device}")
        old.copy_(value)


@dataclass
class Piece:
    name: str
    key: Any                                   # device-map key: "embed" | layer index | "head"
    graphable: bool
    run: Callable[[], dict[str, torch.Tensor]]
    src_key: Any = None                        # transfers: the device-map key of the producing side


@dataclass
class StepInput:
    """What the eager pieces need of the current step (set by the decoder before the pieces run)."""

    state: Any = None
    start: int = 0


def advance(model: Any, state: Any, token_id: Any, cur: StepInput) -> None:
    """``NativeModel.decode_step``'s checks and bookkeeping: append the token to ``state`` and point
    ``cur`` at the new position (the caches themselves advance in the eager pieces)."""
    model.begin_decode_step(state, token_id)
    cur.state, cur.start = state, state.start


def finish(state: Any, cur: StepInput) -> None:
    """What ``Block.__call__`` does last: every layer's cache now holds the new position."""
    for lc in state.layers:
        lc.length = cur.start + 1


def static_inputs(model: Any, buf: Buffers) -> dict[str, torch.device]:
    """Create the per-device token and position buffers; returns buffer suffix -> device."""
    names = {str(torch.device(v)): torch.device(v) for v in model.device_map.values()}
    for name, d in names.items():
        buf.t[f"tok@{name}"] = torch.zeros(1, dtype=torch.int64, device=d)
        buf.t[f"pos@{name}"] = torch.zeros(1, dtype=torch.int64, device=d)
    return names


class PieceRunner:
    """The pieces run eagerly in order, on any device: ``step`` equals ``model.decode_step``. The
    CPU-testable half of the CUDA-graph decoder (same pieces, no graphs, no streams)."""

    def __init__(self, model: Any) -> None:
        self.model, self.buf, self.cur = model, Buffers(), StepInput()
        self.pieces = build_pieces(model, self.buf, self.cur)
        self.names = static_inputs(model, self.buf)

    def step(self, state: Any, token_id: Any) -> torch.Tensor:
        advance(self.model, state, token_id, self.cur)
        with torch.no_grad():
            for name in self.names:
                self.buf.t[f"tok@{name}"].fill_(int(state.token_ids[-1]))
                self.buf.t[f"pos@{name}"].fill_(self.cur.start)
            for p in self.pieces:
                self.run_piece(p)
        finish(state, self.cur)
        return self.buf["logits"][0].clone()

    def run_piece(self, p: Piece) -> None:
        """One piece, its outputs stored (a subclass may wrap it, e.g. to time each piece)."""
        for n, v in p.run().items():
            self.buf.put(n, v)


def build_pieces(model: Any, buf: Buffers, cur: StepInput) -> list[Piece]:
    """The pieces of one decode step of ``model`` (see the module doc), in execution order."""
    dev = {k: str(torch.device(v)) for k, v in model.device_map.items()}
    L = len(model.blocks)
    x_in = {0: _x_name(0, dev["embed"], dev[0])}
    pieces = [Piece("embed", "embed", False, lambda: {"X0": model.embed(cur.state.chunk)})]
    for i in range(L):
        if x_in[i] != f"X{i}":
            pieces.append(_transfer(f"X{i}", x_in[i], i, dev[i], buf, "embed" if i == 0 else i - 1))
        pieces += _layer_pieces(model, i, dev[i], x_in[i], buf, cur)
        nxt = dev[i + 1] if i + 1 < L else dev["head"]
        x_in[i + 1] = _x_name(i + 1, dev[i], nxt)
    if x_in[L] != f"X{L}":
        pieces.append(_transfer(f"X{L}", x_in[L], "head", dev["head"], buf, L - 1))
    pieces.append(Piece("head", "head", True, lambda: {"logits": model.head(buf[x_in[L]])}))
    return pieces


def _x_name(i: int, src: str, dst: str) -> str:
    return f"X{i}" if src == dst else f"X{i}@{dst}"


def _transfer(src: str, dst_name: str, key: Any, dst: str, buf: Buffers, src_key: Any) -> Piece:
    return Piece(f"{src}->{dst}", key, False, lambda: {dst_name: buf[src].to(dst)}, src_key)


def _layer_pieces(model: Any, i: int, dev: str, x_name: str, buf: Buffers, cur: StepInput) -> list[Piece]:
    blk = model.blocks[i]
    a, moe = blk.attention, blk.moe
    p = f"L{i}."
    tok, pos = f"tok@{dev}", f"pos@{dev}"

    def attn_pre() -> dict[str, torch.Tensor]:
        X = buf[x_name]
        pre, post, comb = blk.hc_attn.mix(X)
        xn = blk.attn_norm.defer(blk.hc_attn.collapse(X, pre))
        q, q_lat = a.query(xn)
        kv = a.apply_rope(a.key_value(xn), buf[pos])
        out = {p + "post": post, p + "comb": comb, p + "x": xn.raw, p + "q_lat": q_lat.raw,
               p + "q": a.apply_rope(q, buf[pos]), p + "kv": kv}
        # the new token's own work, whatever the caches hold, is captured here, not in the eager core:
        # the window row's encoding, the compressors' projections, the indexer's treated query and weights
        out[p + "kv.stored"] = a.kv_storage.roundtrip(kv)
        if a.compressor is not None:
            out[p + "c.kv"], out[p + "c.gate"] = a.compressor.project(xn)
        if a.indexer is not None:
            out.update({p + n: t for n, t in zip(INDEXER_PREPARED, a.indexer.prepare(xn, q_lat, buf[pos]))})
        return out

    def attn_core() -> dict[str, torch.Tensor]:
        cache, start, positions = cur.state.layers[i], cur.start, buf[pos]
        xn = NormedInput(buf[p + "x"], blk.attn_norm)
        raw, raw_pos = a.window_keys(buf[p + "kv"], cache, start, buf[p + "kv.stored"])
        entries = None if a.compressor is None else a.compressed_entries(xn, cache, start,
                                                                        (buf[p + "c.kv"], buf[p + "c.gate"]))
        topk = None if a.indexer is None else a.indexer(
            xn, NormedInput(buf[p + "q_lat"], a.q_norm), positions, cache, start,
            tuple(buf[p + n] for n in INDEXER_PREPARED))
        return {p + "o": a.attend(buf[p + "q"], raw, raw_pos, entries, topk, positions, start=start)}

    def attn_out() -> dict[str, torch.Tensor]:
        o = a.apply_rope(buf[p + "o"], buf[pos], inverse=True)    # static shape: captured, not in the core
        X = blk.hc_attn.post(a.output(o), buf[x_name], buf[p + "post"], buf[p + "comb"])
        pre, post, comb = blk.hc_ffn.mix(X)
        xn = blk.ffn_norm.defer(blk.hc_ffn.collapse(X, pre))
        ids, weights = moe.router(xn, buf[tok])
        return {p + "Xa": X, p + "post2": post, p + "comb2": comb, p + "x2": xn.raw, p + "ids": ids,
                p + "weights": weights}

    def dispatch() -> dict[str, torch.Tensor]:
        order, token, offsets = moe.dispatch(buf[p + "ids"])
        return {p + "order": order, p + "token": token, p + "offsets": offsets}

    def ffn() -> dict[str, torch.Tensor]:
        xn = NormedInput(buf[p + "x2"], blk.ffn_norm)
        order, token, offsets, ids = buf[p + "order"], buf[p + "token"], buf[p + "offsets"], buf[p + "ids"]
        h = moe.apply_route_weight(moe.expert_activation(take_rows(xn, token), offsets),
                                   buf[p + "weights"].reshape(-1)[order])
        routed = moe.combine(moe.w2(h, offsets), order, ids.shape[0])
        out = (routed + moe.shared(xn).to(torch.float32)).to(torch.bfloat16)
        return {f"X{i + 1}": blk.hc_ffn.post(out, buf[p + "Xa"], buf[p + "post2"], buf[p + "comb2"])}

    return [Piece(p + "attn_pre", i, True, attn_pre), Piece(p + "attn_core", i, False, attn_core),
            Piece(p + "attn_out", i, True, attn_out), Piece(p + "dispatch", i, True, dispatch),
            Piece(p + "ffn", i, True, ffn)]
