"""A small fake model implementing docs/model_surface.md, for harness tests that must not depend on
the real models' numerics: deterministic weights, every probe with its documented shape, optional
deterministic noise (a stand-in for quantization) and an injectable fault in one layer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import zlib

import torch
import torch.nn.functional as F

from dsv4 import probes
from dsv4.config import DSV4Config


@dataclass
class FakeState:
    ids: torch.Tensor
    layer_inputs: dict[int, torch.Tensor] = field(default_factory=dict)   # what layer(i) received


class FakeModel:
    """``noise``: relative noise added to every float probe's computation (seeded per probe);
    ``fault``: (layer, suffix, scale) multiplies that probe's value — and what follows from it —
    by ``scale``."""

    def __init__(self, config: DSV4Config, fingerprint: str, *, seed: int = 0, noise: float = 0.0,
                 noise_seed: int = 1, fault: tuple[int, str, float] | None = None) -> None:
        self.config, self.fingerprint = config, fingerprint
        self.noise, self.noise_seed, self.fault = noise, noise_seed, fault
        self.calls: list[str] = []
        g = torch.Generator().manual_seed(seed)
        c = config
        D, H, d, E = c.hidden_size, c.num_attention_heads, c.head_dim, c.n_routed_experts

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g) / shape[0] ** 0.5

        self.embed_w = torch.randn(c.vocab_size, D, generator=g)
        self.layers = [dict(q=w(D, H * d), kv=w(D, d), iq=w(D, c.index_n_heads * c.index_head_dim), o=w(H * d, D),
                            gate=w(D, E), bias=0.1 * torch.randn(E, generator=g), routed=w(D, D), shared=w(D, D),
                            tid2eid=torch.stack([torch.randperm(E, generator=g)[:c.num_experts_per_tok]
                                                 for _ in range(c.vocab_size)]))
                       for _ in range(c.num_hidden_layers)]
        self.head_w = w(D, c.vocab_size) * 3.0

    def describe(self) -> dict[str, Any]:
        return {"side": "fake", "noise": self.noise, "fault": self.fault}

    def _p(self, layer: int | None, suffix: str, x: torch.Tensor) -> torch.Tensor:
        """Apply the noise and the fault to a probe value, emit it, return what flows on."""
        name = suffix if layer is None else f"layers.{layer}.{suffix}"
        if self.noise and x.is_floating_point() and x.numel():
            # crc32, not hash(): str hashes change between processes, the noise must not
            g = torch.Generator().manual_seed(zlib.crc32(f"{self.noise_seed}:{name}:{x.shape[0]}".encode()))
            finite = torch.isfinite(x)
            scale = x[finite].std() if int(finite.sum()) > 1 else torch.tensor(0.0)
            x = torch.where(finite, x + self.noise * scale * torch.randn(x.shape, generator=g), x)
        if self.fault is not None and self.fault[0] == layer and self.fault[1] == suffix:
            x = x * self.fault[2]
        probes.emit(name, x.to(torch.bfloat16) if x.is_floating_point() and suffix not in _FP32 else x)
        return x

    # ---- surface ------------------------------------------------------------------------------
    def new_state(self, ids: torch.Tensor) -> FakeState:
        return FakeState(ids.to("cpu", torch.int64))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls.append("embed")
        e = self._p(None, "embed", self.embed_w[ids.to(torch.int64)])
        return e[:, None, :].expand(-1, self.config.hc_mult, -1).to(torch.bfloat16).contiguous()

    def layer(self, i: int, X: torch.Tensor, state: FakeState) -> torch.Tensor:
        self.calls.append(f"layer{i}")
        state.layer_inputs[i] = X.detach().clone()
        c, W = self.config, self.layers[i]
        X = X.to(torch.float32)
        T = X.shape[0]
        pre = self._p(i, "hc.attn.pre", X.mean(1))
        q = self._p(i, "attn.q", (pre @ W["q"]).view(T, c.num_attention_heads, c.head_dim))
        kv = self._p(i, "attn.kv", pre @ W["kv"])
        kind, m = c.layer_kind(i), c.compress_ratio(i)
        if kind != "window":
            n = T // m
            self._p(i, "attn.compressed_kv", kv[: n * m].view(n, m, kv.shape[-1]).mean(1))
        if kind == "csa":
            n = T // m
            iq = self._p(i, "attn.indexer.q", (pre @ W["iq"]).view(T, c.index_n_heads, c.index_head_dim))
            ik = self._p(i, "attn.indexer.k", iq.mean(1)[: n * m].view(n, m, c.index_head_dim).mean(1))
            scores = iq.mean(1) @ ik.T
            causal = torch.arange(n)[None, :] >= ((torch.arange(T) + 1) // m)[:, None]
            scores = self._p(i, "attn.indexer.scores", scores.masked_fill(causal, float("-inf")))
            k = min(c.index_topk, n)
            if k:
                top = scores.topk(k, dim=-1)
                idx = torch.where(torch.isfinite(top.values), top.indices, torch.full_like(top.indices, -1))
                idx = torch.where(idx < 0, torch.full_like(idx, 1 << 30), idx).sort(-1).values
                idx = torch.where(idx == 1 << 30, torch.full_like(idx, -1), idx)
            else:
                idx = torch.empty(T, 0, dtype=torch.int64)
            self._p(i, "attn.indexer.topk", idx)
        core = self._p(i, "attn.core", q)
        a = self._p(i, "attn.out", core.reshape(T, -1) @ W["o"])
        X = self._p(i, "hc.attn.post", X + 0.1 * a[:, None, :])
        fpre = self._p(i, "hc.ffn.pre", X.mean(1))
        logits = self._p(i, "ffn.router.logits", fpre @ W["gate"])
        s = torch.sqrt(F.softplus(logits))
        kk = c.num_experts_per_tok
        ids = W["tid2eid"][state.ids] if c.is_hash_layer(i) else (s + W["bias"]).topk(kk, -1).indices
        self._p(i, "ffn.router.topk_ids", ids)
        wts = s.gather(-1, ids)
        self._p(i, "ffn.router.weights", wts / wts.sum(-1, keepdim=True) * c.routed_scaling_factor)
        routed = self._p(i, "ffn.routed.out", torch.tanh(fpre @ W["routed"]))
        shared = self._p(i, "ffn.shared.out", torch.tanh(fpre @ W["shared"]))
        f = self._p(i, "ffn.out", routed + shared)
        return self._p(i, "out", X + 0.1 * f[:, None, :]).to(torch.bfloat16)

    def head(self, X: torch.Tensor) -> torch.Tensor:
        self.calls.append("head")
        h = self._p(None, "hc_head", X.to(torch.float32).mean(1))
        n = self._p(None, "final_norm", h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
        return self._p(None, "logits", n @ self.head_w)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        state = self.new_state(ids)
        X = self.embed(ids)
        for i in range(self.config.num_hidden_layers):
            X = self.layer(i, X, state)
        return self.head(X)


_FP32 = ("ffn.router.logits", "ffn.router.weights", "attn.indexer.scores", "logits")


class FakeLoaders:
    """Reference = a noiseless FakeModel; native = the same weights plus noise for FP4 plans (none for
    the all-fp32 logic plan), optionally with a fault. Counts what it built."""

    def __init__(self, fingerprint: str, *, fp4_noise: float = 0.02, fault: tuple[int, str, float] | None = None,
                 fault_plans: tuple[str, ...] = ("all-fp32", "default")) -> None:
        self.fingerprint, self.fp4_noise, self.fault, self.fault_plans = fingerprint, fp4_noise, fault, fault_plans
        self.built: list[str] = []
        self.models: list[FakeModel] = []

    def _config(self, path: str) -> DSV4Config:
        from dsv4.checkpoint import open_checkpoint

        return open_checkpoint(path).config

    def reference(self, path: str, *, profile: str, dtype: torch.dtype, device: str,
                  device_map: Mapping[Any, str] | None) -> FakeModel:
        self.built.append(f"reference:{profile}")
        m = FakeModel(self._config(path), self.fingerprint)
        self.models.append(m)
        return m

    def native(self, path: str, *, plan: Any, backend: str, device: str,
               device_map: Mapping[Any, str] | None) -> FakeModel:
        name = getattr(plan, "name", str(plan))
        self.built.append(f"native:{name}/{backend}")
        noise = 0.0 if name == "all-fp32" else self.fp4_noise
        m = FakeModel(self._config(path), self.fingerprint, noise=noise,
                      fault=self.fault if name in self.fault_plans else None)
        self.models.append(m)
        return m
