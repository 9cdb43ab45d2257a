"""Building the draft from a checkpoint's ``mtp.*`` tensors under the plan's ``draft_*`` classes, with
the trunk model's builder (``dsv4.model._Builder``): same conversions, same layer classes, same
dispatchers; only the names (``mtp.{s}.*``) and the plan classes differ."""
from __future__ import annotations

from typing import Any

import torch

from ..checkpoint.reader import CheckpointReader
from ..layers.kv_cache import KV_STORAGES
from ..layers.mhc import HCHead
from ..layers.norm import RMSNorm
from ..layers.rope import Rope, rope_omega
from ..model import _Builder
from ..probes import draft_class
from ..weights import split_rows
from .layers import DraftAttention, DraftHead, DraftStage, Join, ProjectedHCHead


class _StageReader:
    """The reader seen by one stage's builder: canonical names resolve to ``mtp.{stage}.<name>``."""

    def __init__(self, reader: CheckpointReader, stage: int) -> None:
        self.reader, self.stage, self.config = reader, stage, reader.config

    def weight(self, name: str, layer: int | None = None) -> Any:
        return self.reader.weight(f"mtp.{self.stage}.{name}")


class StageBuilder(_Builder):
    """``_Builder`` over one stage: trunk class ``c`` of a stage weight is planned as ``draft_c``."""

    def __init__(self, reader: CheckpointReader, stage: int, **kw: Any) -> None:
        super().__init__(_StageReader(reader, stage), **kw)   # type: ignore[arg-type]
        self.stage = stage

    def klass(self, trunk_class: str) -> str:
        return draft_class(trunk_class)

    def attention(self, i: int, device: str) -> DraftAttention:
        c = self.c
        rope = Rope(rope_omega(c, compressed=False).to(device), c.qk_rope_head_dim)   # window: rope_theta, no YaRN
        wo_a = self.grouped([[g] for g in split_rows(self.r.weight("attn.wo_a"), c.o_groups)],
                            f"layers.{i}.attn.wo_a", self.klass("attn_o"), device)
        return DraftAttention(
            f"layers.{i}.", wq_a=self.linear(["attn.wq_a"], i, device), q_norm=self.norm("attn.q_norm", i, device),
            wq_b=self.linear(["attn.wq_b"], i, device), wkv=self.linear(["attn.wkv"], i, device),
            kv_norm=self.norm("attn.kv_norm", i, device), wo_a=wo_a, wo_b=self.linear(["attn.wo_b"], i, device),
            sink=self.tensor("attn.attn_sink", i, device), rope=rope,
            kv_storage=KV_STORAGES[self.plan["kv_cache"]](c.head_dim, c.qk_rope_head_dim),
            compressor=None, indexer=None, n_heads=c.num_attention_heads, head_dim=c.head_dim,
            o_groups=c.o_groups, window=c.sliding_window, ratio=0, eps=c.rms_norm_eps)

    def stage_block(self, device: str) -> DraftStage:
        i = self.c.num_hidden_layers + self.stage
        return DraftStage(self.stage, i, hc_attn=self.hc("attn", i, device), attn_norm=self.norm("attn_norm", i, device),
                          attention=self.attention(i, device), hc_ffn=self.hc("ffn", i, device),
                          ffn_norm=self.norm("ffn_norm", i, device), moe=self.moe(i, device, hashed=False),
                          window=self.c.sliding_window, device=torch.device(device))

    def join(self, device: str) -> Join:
        i = self.c.num_hidden_layers + self.stage
        return Join(self.linear(["main_proj"], i, device, component="draft_main_proj"),
                    self.norm("main_norm", i, device))

    def draft_head(self, lm_head: Any, device: str) -> DraftHead:
        c, i = self.c, self.c.num_hidden_layers + self.stage
        base, scale = (self.tensor(f"hc_head_{p}", i, device) for p in ("base", "scale"))
        if self.plan["draft_hc_head"] == "fp4":
            hc: HCHead = ProjectedHCHead(self.linear(["hc_head_fn"], i, device, out_dtype=torch.float32,
                                                     component="draft_hc_head"),
                                         base, scale, hc_eps=c.hc_eps, rms_eps=c.rms_norm_eps)
        else:
            hc = HCHead(self.tensor("hc_head_fn", i, device), base, scale, hc_eps=c.hc_eps, rms_eps=c.rms_norm_eps)
        w1 = self.tensor("markov_head.markov_w1", i, device)
        w2 = self.linear(["markov_head.markov_w2"], i, device, out_dtype=torch.float32, component="draft_markov_head")
        conf = self.linear(["confidence_head.proj"], i, device, out_dtype=torch.float32,
                           component="draft_confidence_head")
        return DraftHead(hc, RMSNorm(self.tensor("norm", i, device), c.rms_norm_eps), lm_head, w1, w2, conf)
