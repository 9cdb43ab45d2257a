"""Faults of the DSpark draft (docs/dspark.md, docs/bugzoo.md): each patches one native draft
instance (``dsv4.dspark.NativeDSpark``) with a bug seen or plausible in ports of the 0731 draft, and
names where draft parity must localize it: ``place`` (``stage s``, ``join``, ``target capture``,
``head``) and ``component`` (a plan or localization class), as ``parity.dspark.compare.where_of``
reports them. ``column``: the draft-parity column that must raise the alarm."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import contextlib

import torch

from .registry import patched


@dataclass(frozen=True)
class DraftFault:
    name: str
    place: str
    component: str
    column: str
    description: str
    apply: Callable[[Any], ContextManager[None]]

    def __call__(self, draft: Any) -> ContextManager[None]:
        if getattr(draft, "side", "") != "native" or not hasattr(draft, "blocks"):
            raise TypeError(f"DSpark fault {self.name}: expected a native draft (dsv4.dspark.NativeDSpark), found "
                            f"{type(draft).__name__}")
        return self.apply(draft)


DSPARK_FAULTS: dict[str, DraftFault] = {}


def register(name: str, *, place: str, component: str, column: str, description: str):
    def wrap(fn: Callable[[Any], Iterator[None]]) -> DraftFault:
        f = DraftFault(name, place, component, column, description, contextlib.contextmanager(fn))
        DSPARK_FAULTS[name] = f
        return f
    return wrap


@register("dspark_capture_layer_inputs", place="target capture", component="mhc", column="logic",
          description="main_hidden taken from each target layer's input (the previous layer's output), "
                      "not its output: the V4.1 convention applied to a V4 checkpoint (dspark.md §4.1)")
def capture_layer_inputs(draft: Any) -> Iterator[None]:
    c, t = draft.config, draft.target
    ids = tuple(i - 1 for i in c.dspark_target_layer_ids)

    def trunk(state):
        from dsv4 import probes

        X, taken = t.embed(state.chunk), {}
        for i in range(c.num_hidden_layers):
            X = t.layer(i, X, state)
            if i in ids:
                taken[i] = X.to(torch.float32).mean(dim=1).to(t.act_dtype).to(draft.device)
        mh = torch.cat([taken[i] for i in ids], dim=-1)
        probes.emit("dspark.main_hidden", mh)
        return t.head(X), mh

    with patched(draft, "trunk", trunk):
        yield


@register("dspark_block_attended_causally", place="stage 1", component="attention", column="logic",
          description="stage 1's block rows attend causally among themselves (a trunk mask reused), not to "
                      "all γ block keys (dspark.md Eq 12)")
def block_causal(draft: Any) -> Iterator[None]:
    att = draft.blocks[1].attention
    real = att.softmax_with_sink

    def softmax_with_sink(scores, valid, sink):
        g = draft.gamma
        ctx = scores.shape[-1] - g
        mask = valid.clone()
        mask[:, ctx:] &= torch.ones(g, g, dtype=torch.bool, device=valid.device).tril()
        return real(scores, mask, sink)

    with patched(att, "softmax_with_sink", softmax_with_sink):
        yield


@register("dspark_markov_from_anchor", place="head", component="draft_markov_head", column="logic",
          description="every row's Markov correction taken from the anchor, not from the token drafted "
                      "before it (dspark.md Eq 17)")
def markov_from_anchor(draft: Any) -> Iterator[None]:
    head = draft.head_module
    real = head.row
    first: dict[str, int] = {}

    def row(z_r, u_r, prev):
        # row 0 is called with the anchor; keep using it for rows 1..γ-1 of the same call
        if "prev" not in first or first.get("rows", 0) >= draft.gamma:
            first.update(prev=prev, rows=0)
        first["rows"] += 1
        return real(z_r, u_r, first["prev"])

    with patched(head, "row", row):
        yield


@register("dspark_context_rope_off_by_one", place="stage 0", component="draft_attn_kv", column="logic",
          description="stage 0's ring entries rotated at position t + 1 (the anchor's numbering) instead "
                      "of t (dspark.md Eq 4)")
def context_rope_off_by_one(draft: Any) -> Iterator[None]:
    att = draft.blocks[0].attention
    real = att.context_entries

    def context_entries(m, positions):
        return real(m, positions + 1)

    with patched(att, "context_entries", context_entries):
        yield


@register("dspark_main_norm_skipped", place="join", component="draft_main_proj", column="logic",
          description="the join's main_norm skipped: main_proj's output goes to every stage's wkv "
                      "unnormalized (dspark.md Eq 3)")
def main_norm_skipped(draft: Any) -> Iterator[None]:
    join = draft.join
    with patched(join, "norm", lambda x: x.to(draft.target.act_dtype)):
        yield
