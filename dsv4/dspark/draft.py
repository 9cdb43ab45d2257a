"""The native DSpark draft of one native target model (docs/dspark.md): the capture and join of the
target layers' hidden states, one ring per stage, the draft call (one parallel pass over γ block
rows, then the Markov loop) and the greedy speculative loop.

The draft shares the target's embedding, LM head and kernel dispatchers (so the kernel log and the
call audit see every draft GEMM); it holds ``blocks`` (its stages) and ``head_module`` as the target
does, which is what the weight audit walks."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import probes
from ..checkpoint.reader import open_checkpoint
from ..layers.kv_cache import WindowCache
from ..model import DecodeState, NativeModel, set_act_dtype
from .build import StageBuilder
from .layers import DraftHead, DraftStage, Join


@dataclass
class DraftState:
    """Per stage the ring of context entries (slot = position mod W) and ``pos``: the context
    positions committed so far; the next anchor sits at position ``pos``."""

    rings: list[WindowCache]

    @property
    def pos(self) -> int:
        return self.rings[0].length


@dataclass(frozen=True)
class Draft:
    """One draft call: tokens d_1..d_γ, logits [γ, V] after the Markov correction, base logits [γ, V]
    before it, confidence [γ] (raw logits)."""

    tokens: list[int]
    logits: torch.Tensor
    base_logits: torch.Tensor
    confidence: torch.Tensor


@dataclass
class SpecResult:
    """A greedy speculative generation: the tokens and, per verify step, how many drafts were accepted."""

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        return sum(a + 1 for a in self.accepted) / len(self.accepted) if self.accepted else float("nan")


class NativeDSpark:
    side = "native"

    def __init__(self, target: NativeModel, stages: list[DraftStage], join: Join, head: DraftHead,
                 conversions: list[Any]) -> None:
        self.target, self.config = target, target.config
        self.blocks, self.join, self.head_module = stages, join, head
        self.conversion_records = conversions
        self.dispatchers = target.dispatchers
        self.plan = target.plan
        self.gamma = self.config.dspark_block_size
        self.device = target.device_map["head"]

    # ---- target side -------------------------------------------------------------------------------
    def trunk(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        """The target over ``state.chunk`` (extending its caches): logits [T, V] and main_hidden
        M [T, 3D] (Eq 1-2: the stream mean after each target layer, in config order)."""
        t, c = self.target, self.config
        X, taken = t.embed(state.chunk), {}
        for i in range(c.num_hidden_layers):
            X = t.layer(i, X, state)
            if i in c.dspark_target_layer_ids:
                taken[i] = X.to(torch.float32).mean(dim=1).to(t.act_dtype).to(self.device)
        mh = torch.cat([taken[i] for i in c.dspark_target_layer_ids], dim=-1)
        probes.emit("dspark.main_hidden", mh)
        return t.head(X), mh

    def new_state(self) -> DraftState:
        return DraftState([s.new_ring() for s in self.blocks])

    def commit(self, ds: DraftState, main_hidden: torch.Tensor) -> None:
        """Eq 3-5 for the next committed rows (positions ds.pos..): every stage's ring."""
        T, want = main_hidden.shape[0], len(self.config.dspark_target_layer_ids) * self.config.hidden_size
        if main_hidden.dim() != 2 or main_hidden.shape[1] != want:
            raise ValueError(f"DSpark commit: expected main_hidden [T, {want}], found {list(main_hidden.shape)}")
        start = ds.pos
        positions = torch.arange(start, start + T, device=self.device)
        m = self.join(main_hidden.to(self.device, self.target.act_dtype))
        probes.emit("dspark.join", m)
        for stage, ring in zip(self.blocks, ds.rings):
            ring.write(start, stage.attention.context_entries(m, positions))

    # ---- draft side ----------------------------------------------------------------------------------
    @torch.no_grad()
    def draft(self, ds: DraftState, anchor: int, temperature: float = 0.0,
              generator: torch.Generator | None = None, forced: list[int] | None = None) -> Draft:
        """Eq 6-18: the γ draft tokens after ``anchor`` (at position ds.pos): argmax at temperature 0,
        else drawn from softmax(ℓ_r / T), each row corrected from the token drawn before it.
        ``forced`` (γ ids) drives the Markov chain instead of the drawn tokens (row-by-row comparison)."""
        c, t = self.config, self.target
        if not 0 <= int(anchor) < c.vocab_size:
            raise ValueError(f"DSpark draft: expected an anchor id in [0, {c.vocab_size}), found {anchor}")
        ids = torch.tensor([int(anchor)] + [c.dspark_noise_token_id] * (self.gamma - 1), device=self.device)
        positions = torch.arange(ds.pos, ds.pos + self.gamma, device=self.device)
        X = t.embed_weight[ids.to(t.embed_weight.device)].to(t.act_dtype).to(self.device)
        X = X[:, None, :].expand(-1, c.hc_mult, -1).contiguous()
        for stage, ring in zip(self.blocks, ds.rings):
            X = stage(X, ring, positions, ids)
        z, u = self.head_module.base(X)
        prev, tokens, rows, conf = int(anchor), [], [], []
        for r in range(self.gamma):
            lr, cr = self.head_module.row(z[r], u[r], prev)
            prev = int(torch.argmax(lr)) if temperature <= 0 else int(torch.multinomial(
                torch.softmax(lr.double() / max(temperature, 1e-5), -1), 1, generator=generator))
            tokens.append(prev)
            if forced is not None:
                prev = int(forced[r])
            rows.append(lr)
            conf.append(cr)
        logits, confidence = torch.stack(rows), torch.stack(conf)
        probes.emit("dspark.logits", logits)
        probes.emit("dspark.confidence", confidence)
        return Draft(tokens, logits, u, confidence)

    # ---- the greedy speculative loop ---------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_tokens: int) -> SpecResult:
        """Greedy speculation (dspark.md §5): draft, verify [a, d_1..d_γ] in one target pass, keep the
        longest agreeing prefix plus the target's bonus token, commit the accepted rows (the target's
        caches rolled back to before the verify pass and the accepted rows run again)."""
        t = self.target
        logits, state = None, t.new_state(prompt)
        logits, mh = self.trunk(state)
        ds = self.new_state()
        self.commit(ds, mh)
        anchor = int(torch.argmax(logits[-1]))
        out = SpecResult([anchor])
        while len(out.tokens) < n_tokens:
            d = self.draft(ds, anchor)
            before = copy.deepcopy(state)
            _extend(state, [anchor] + d.tokens)
            target = torch.argmax(self.trunk(state)[0], dim=-1).tolist()
            n = 0
            while n < self.gamma and d.tokens[n] == target[n]:
                n += 1
            state = before
            _extend(state, [anchor] + d.tokens[:n])
            _, mh = self.trunk(state)
            self.commit(ds, mh)
            anchor = target[n]
            out.tokens += d.tokens[:n] + [anchor]
            out.accepted.append(n)
        out.tokens = out.tokens[:n_tokens]
        return out


def _extend(state: DecodeState, ids: list[int]) -> None:
    state.start = state.pos
    state.token_ids = torch.cat((state.token_ids, torch.tensor(ids, dtype=torch.int64)))


def load_dspark(target: NativeModel) -> NativeDSpark:
    """The draft of ``target``'s checkpoint, built under ``target``'s plan on its dispatchers and the
    head's device. A checkpoint without DSpark stages is one clear error before any conversion."""
    reader = open_checkpoint(target.checkpoint_path)
    c = reader.config
    if not c.dspark_block_size or not reader.has_mtp:
        raise ValueError(f"DSpark: expected a checkpoint with dspark_* config keys and mtp.0-{max(c.dspark_stages, 1) - 1} "
                         f"tensors (the 0731/0813 layout), found dspark_block_size={c.dspark_block_size} and "
                         f"{'no ' if not reader.has_mtp else ''}mtp.* tensors in {reader.path}")
    dev = target.device_map["head"]
    kw = dict(plan=target.plan, devices=target.device_map, dispatchers=target.dispatchers, act_scale=target.act_scale)
    records: list[Any] = []
    builders = [StageBuilder(reader, s, **kw) for s in range(c.dspark_stages)]
    for b in builders:
        b.records = records
    stages = [b.stage_block(dev) for b in builders]
    join = builders[0].join(dev)
    head = builders[-1].draft_head(target.head_module.lm_head, dev)
    if target.act_dtype != torch.bfloat16:
        set_act_dtype([stages, join, head], target.act_dtype)
    return NativeDSpark(target, stages, join, head, records)
