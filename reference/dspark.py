"""The DSpark draft of the 0731/0813 releases (docs/dspark.md, equations numbered as there): the
capture and join of the target layers' hidden states, one 128-slot (``sliding_window``) context
ring per stage, each stage's block over the γ draft rows (non-causal inside the block), the hc-head
collapse, the shared LM head, the Markov correction and the confidence head.

Stage s is trunk layer id L + s (its probes are ``layers.{L+s}.*``, as the official code numbers
them), window-only, score-routed. The join ``main_hidden`` enters only as attention keys/values
through the rings; it is never added to the residual stream. Same independence rules as the rest
of the reference: it imports only compute-free parts of dsv4."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv4 import probes

from .attention import AttentionWeights, grouped_output, kv_fake_quant, project_qkv
from .mhc import hc_head, hc_post, hc_pre
from .model import ReferenceModel, build_moe
from .ops import ACC, linear, mm, rms_norm
from .rope import apply_rope, cos_sin, rope_spec


class StageWeights:
    """The weights of DSpark stage ``mtp.{stage}`` on one device (same call as LayerWeights)."""

    def __init__(self, model: ReferenceModel, stage: int, device: str) -> None:
        self.store, self.stage, self.device = model.store, stage, device

    def __call__(self, name: str, fp32: bool = False) -> torch.Tensor:
        return self.store.get(f"mtp.{self.stage}.{name}", None, self.device, fp32)


@dataclass
class DSparkState:
    """Per stage the ring R_s [W, head_dim] of context kv (Eq 4-5, slot t mod W) and ``pos``: the
    context positions written so far (0..pos-1); the next anchor sits at position ``pos``."""

    rings: list[torch.Tensor]
    pos: int = 0


@dataclass(frozen=True)
class Draft:
    """Eq 17-18 outputs of one draft call: ``tokens`` d_1..d_γ, ``logits`` [γ, V] fp32 after the
    Markov correction, ``base_logits`` U [γ, V] before it, ``confidence`` [γ] raw logits."""

    tokens: list[int]
    logits: torch.Tensor
    base_logits: torch.Tensor
    confidence: torch.Tensor


@dataclass
class SpecResult:
    """A greedy speculative generation: the tokens, and per verify step how many drafts were accepted."""

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """τ = accepted drafts + 1 per verify step (dspark.md §5 step 4), mean over steps."""
        return sum(a + 1 for a in self.accepted) / len(self.accepted) if self.accepted else float("nan")


def rejection_accept(draft_probs: torch.Tensor, target_probs: torch.Tensor, tokens: list[int],
                     generator: torch.Generator | None = None) -> tuple[int, int]:
    """Standard speculative sampling (dspark.md §5 step 3): for j = 1..γ accept d_j with probability
    min(1, q_{j-1}(d_j) / p_j(d_j)); at the first rejection draw the replacement from
    norm(max(0, q_{j-1} − p_j)) and stop; if all are accepted draw the bonus from q_γ. ``draft_probs``
    [γ, V] are the Markov-corrected draft probabilities the tokens were drawn from, ``target_probs``
    [γ+1, V] the target's. Returns (accepted drafts n, the token committed after them). The committed
    tokens are distributed exactly as the target's own sampling would draw them."""
    g = len(tokens)
    if tuple(draft_probs.shape[:1]) != (g,) or target_probs.shape[0] != g + 1:
        raise ValueError(f"rejection_accept: expected draft probs [{g}, V] and target probs [{g + 1}, V] for {g} "
                         f"tokens, found {list(draft_probs.shape)} and {list(target_probs.shape)}")
    p, q = draft_probs.to(ACC), target_probs.to(ACC)
    for j, t in enumerate(tokens):
        u = torch.rand((), dtype=ACC, generator=generator)
        if u * p[j, t] <= q[j, t]:                       # u < q/p without dividing by a zero p
            continue
        residual = (q[j] - p[j]).clamp_min(0)
        return j, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return g, int(torch.multinomial(q[g], 1, generator=generator))


class DSparkReference:
    """The draft of one reference model whose checkpoint carries DSpark stages."""

    def __init__(self, model: ReferenceModel) -> None:
        c = model.config
        if not c.dspark_block_size or not model.reader.has_mtp:
            raise ValueError(f"DSpark: expected a checkpoint with dspark_* config keys and mtp.0-{max(c.dspark_stages, 1) - 1} "
                             f"tensors (the 0731/0813 layout), found dspark_block_size={c.dspark_block_size} and "
                             f"{'no ' if not model.reader.has_mtp else ''}mtp.* tensors in {model.reader.path}")
        self.model, self.c = model, c
        self.gamma, self.stages = c.dspark_block_size, c.dspark_stages
        self.device = model.devices["head"]
        self.rope = rope_spec(c, "window")   # ratio 0: rope_theta, no YaRN (Eq 4)

    # ---- target side -----------------------------------------------------------------------------
    def trunk(self, state) -> tuple[torch.Tensor, torch.Tensor]:
        """The trunk over ``state.ids`` (extending its caches): logits [T, V] and main_hidden M [T, 3D]
        (Eq 1-2: the mean over the streams after each target layer, in config order)."""
        m = self.model
        x, taken = m.embed(state.ids), {}
        for i in range(self.c.num_hidden_layers):
            x = m.layer(i, x, state)
            if i in self.c.dspark_target_layer_ids:
                taken[i] = x.to(ACC).mean(dim=1).to(m.dtype).to(self.device)
        mh = torch.cat([taken[i] for i in self.c.dspark_target_layer_ids], dim=-1)
        probes.emit("dspark.main_hidden", mh)
        return m.head(x), mh

    def new_state(self) -> DSparkState:
        return DSparkState([torch.zeros(self.c.sliding_window, self.c.head_dim, dtype=self.model.dtype,
                                        device=self.device) for _ in range(self.stages)])

    def commit(self, ds: DSparkState, main_hidden: torch.Tensor) -> None:
        """Eq 3-5 for the next rows of committed context (positions ds.pos..): every stage's ring."""
        T, W = main_hidden.shape[0], self.c.sliding_window
        positions = torch.arange(ds.pos, ds.pos + T, device=self.device)
        s0 = StageWeights(self.model, 0, self.device)
        mh = rms_norm(linear(main_hidden, s0("main_proj"), self.model.profile.act_quant), s0("main_norm", True),
                      self.c.rms_norm_eps)                                                     # Eq 3
        probes.emit("dspark.join", mh)
        cs = cos_sin(self.rope, positions)
        for s in range(self.stages):
            sw = StageWeights(self.model, s, self.device)
            kv = apply_rope(rms_norm(linear(mh, sw("attn.wkv"), self.model._quant["attn.wkv"]),
                                     sw("attn.kv_norm", True), self.c.rms_norm_eps), cs)       # Eq 4
            if self.model.profile.kv_fp8:
                kv = kv_fake_quant(kv, self.c.qk_rope_head_dim)
            probes.emit(f"layers.{self.c.num_hidden_layers + s}.attn.context_kv", kv)
            n = min(T, W)
            ds.rings[s][positions[-n:] % W] = kv[-n:]                                          # Eq 5
        ds.pos += T

    # ---- draft side --------------------------------------------------------------------------------
    def _attention(self, s: int, sw: StageWeights, x: torch.Tensor, positions: torch.Tensor,
                   ds: DSparkState) -> torch.Tensor:
        """Eq 9-14: the trunk's q and kv path on the block rows; every row sees the same keys, the
        ring's valid slots (context 0..pos-1, the last W) and all γ block keys; sink in the denominator."""
        c, m = self.c, self.model
        c_layer = c.num_hidden_layers + s
        w = AttentionWeights(sw("attn.wq_a"), sw("attn.q_norm", True), sw("attn.wq_b"), sw("attn.wkv"),
                             sw("attn.kv_norm", True), sw("attn.wo_a"), sw("attn.wo_b"), sw("attn.attn_sink"))
        cs = cos_sin(self.rope, positions)
        q, _, kv = project_qkv(w, m._shape, m._quant, x, cs, m.profile.kv_fp8, f"layers.{c_layer}.")
        keys = torch.cat((ds.rings[s][:min(c.sliding_window, ds.pos)], kv))                    # Eq 12
        sink = w.attn_sink.float()
        sc = (torch.einsum("thd,kd->thk", q.to(ACC), keys.to(ACC)) * c.head_dim ** -0.5).float()
        mx = torch.maximum(sc.amax(dim=-1), sink)
        e = torch.exp((sc - mx.unsqueeze(-1)).to(ACC))
        prob = (e / (e.sum(dim=-1) + torch.exp((sink - mx).to(ACC))).unsqueeze(-1)).float().to(q.dtype)
        o = torch.einsum("thk,kd->thd", prob.to(ACC), keys.to(ACC)).float().to(q.dtype)          # Eq 13
        o = apply_rope(o, cs, inverse=True)
        probes.emit(f"layers.{c_layer}.attn.core", o)
        out = grouped_output(o, w, m._shape, m._quant, x.dtype)                                 # Eq 14
        probes.emit(f"layers.{c_layer}.attn.out", out)
        return out

    def _stage(self, s: int, x: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
               ds: DSparkState) -> torch.Tensor:
        """One stage block (a window-only V4 block with the DSpark attention)."""
        c, layer = self.c, self.c.num_hidden_layers + s
        sw = StageWeights(self.model, s, self.device)
        hc = dict(n=c.hc_mult, iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps, rms_eps=c.rms_norm_eps)
        h, post, comb = hc_pre(x, sw("hc_attn_fn"), sw("hc_attn_scale"), sw("hc_attn_base"), **hc)
        a = self._attention(s, sw, rms_norm(h, sw("attn_norm", True), c.rms_norm_eps), positions, ds)
        x = hc_post(a, x, post, comb)
        h, post, comb = hc_pre(x, sw("hc_ffn_fn"), sw("hc_ffn_scale"), sw("hc_ffn_base"), **hc)
        moe = build_moe(sw, c, self.model._quant, hashed=False)   # a stage is never a hash layer
        f = moe(rms_norm(h, sw("ffn_norm", True), c.rms_norm_eps), ids, layer)
        x = hc_post(f, x, post, comb)
        probes.emit(f"layers.{layer}.out", x)
        return x

    @torch.no_grad()
    def draft(self, ds: DSparkState, anchor: int, temperature: float = 0.0,
              generator: torch.Generator | None = None, forced: list[int] | None = None) -> Draft:
        """Eq 6-18: the γ draft tokens after ``anchor`` (at position ds.pos): argmax at temperature 0,
        else drawn from softmax(ℓ_r / T) (each row corrected from the token drawn before it).
        ``forced`` (γ ids) drives the Markov chain instead of the drawn tokens, so two drafts can be
        compared row by row with the same chain (the harness's teacher forcing)."""
        c, m = self.c, self.model
        ids = torch.tensor([anchor] + [c.dspark_noise_token_id] * (self.gamma - 1), device=self.device)   # Eq 6
        positions = torch.arange(ds.pos, ds.pos + self.gamma, device=self.device)                          # Eq 8
        e = m.store.get("embed", None, self.device)[ids].to(m.dtype)
        x = e.unsqueeze(1).expand(-1, c.hc_mult, -1).contiguous()                                         # Eq 7
        for s in range(self.stages):
            x = self._stage(s, x, ids, positions, ds)
        last = StageWeights(m, self.stages - 1, self.device)
        z = hc_head(x, last("hc_head_fn"), last("hc_head_scale"), last("hc_head_base"), hc_eps=c.hc_eps,
                    rms_eps=c.rms_norm_eps)                                                              # Eq 15
        probes.emit("dspark.hc_head", z)
        u = mm(rms_norm(z, last("norm", True), c.rms_norm_eps), m.store.get("head", None, self.device, True).T).float()
        probes.emit("dspark.base_logits", u)                                                             # Eq 16
        w1 = last("markov_head.markov_w1")                      # [V, r] in the model dtype (a lookup)
        w2 = last("markov_head.markov_w2", True).float()        # [V, r] held fp32
        wc = last("confidence_head.proj", True).float().reshape(-1)
        prev, tokens, rows, conf = anchor, [], [], []
        for r in range(self.gamma):                                                                     # Eq 17
            er = w1[prev]
            lr = u[r] + mm(er.float(), w2.T).float()
            conf.append((wc.to(ACC) @ torch.cat((z[r].float(), er.float())).to(ACC)).float())          # Eq 18
            prev = int(torch.argmax(lr)) if temperature <= 0 else int(
                torch.multinomial(torch.softmax(lr.to(ACC) / max(temperature, 1e-5), -1), 1, generator=generator))
            tokens.append(prev)
            if forced is not None:
                prev = int(forced[r])
            rows.append(lr)
        logits = torch.stack(rows)
        probes.emit("dspark.logits", logits)
        confidence = torch.stack(conf)
        probes.emit("dspark.confidence", confidence)
        m.store.release()
        return Draft(tokens, logits, u, confidence)

    # ---- one speculative loop ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> SpecResult:
        """Speculative decoding (dspark.md §5): draft γ tokens, verify them with one trunk pass over
        [a, d_1..d_γ], accept (greedy at temperature 0: the longest prefix the target's argmax agrees
        with plus its bonus token; else :func:`rejection_accept` on softmax(logits / T) of both), commit
        the accepted rows' hidden states into the rings. Greedy output equals plain greedy decoding
        of the trunk (lossless), whatever the draft proposes."""
        import copy

        m = self.model
        state = m.new_state(prompt)
        logits, mh = self.trunk(state)
        ds = self.new_state()
        self.commit(ds, mh)
        def pick(row: torch.Tensor) -> int:
            if temperature <= 0:
                return int(torch.argmax(row))
            return int(torch.multinomial(torch.softmax(row.to(ACC) / temperature, -1), 1, generator=generator))

        anchor = pick(logits[-1])
        out = SpecResult([anchor])
        while len(out.tokens) < n_tokens:
            d = self.draft(ds, anchor, temperature, generator)
            before = copy.deepcopy(state)
            state.ids, state.start = torch.tensor([anchor] + d.tokens, dtype=torch.int64), state.pos
            q, _ = self.trunk(state)
            if temperature <= 0:
                target = torch.argmax(q, dim=-1).tolist()
                n = 0
                while n < self.gamma and d.tokens[n] == target[n]:
                    n += 1
                nxt = target[n]
            else:
                n, nxt = rejection_accept(torch.softmax(d.logits.to(ACC) / temperature, -1),
                                          torch.softmax(q.to(ACC) / temperature, -1), d.tokens, generator)
            # commit only the accepted rows: rerun the trunk on them from the state before the verify
            state = before
            state.ids, state.start = torch.tensor([anchor] + d.tokens[:n], dtype=torch.int64), state.pos
            again, mh = self.trunk(state)
            if not torch.equal(again, q[:n + 1]):   # the reference is batch-invariant (ops.py): a gap is a bug here
                raise RuntimeError(f"DSpark verify: the accepted rows' logits differ between the verify pass and "
                                   f"the commit pass at position {state.start} (max {float((again - q[:n + 1]).abs().max()):g})")
            self.commit(ds, mh)
            anchor = nxt
            out.tokens += d.tokens[:n] + [anchor]
            out.accepted.append(n)
        out.tokens = out.tokens[:n_tokens]
        return out
