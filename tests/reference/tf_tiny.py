"""A tiny transformers DeepseekV4ForCausalLM with sensible seeded weights, saved as an `hf`-layout
checkpoint the project reads (shared by the cross-check and the transformers-dump tests)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from dsv4.config import preset


def redraw(model: torch.nn.Module, n_heads_idx: int, n: int, n_experts: int, seed: int = 1234) -> None:
    """Sensible, seeded scales: unit-RMS linears (gain 6 on expert gate/up so SwiGLU inputs pass the
    limit), norms near 1, sinks ~ the scores, non-trivial biases, ape and hash tables."""
    g = torch.Generator().manual_seed(seed)

    def rn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if "rotary" in name:
                continue
            if leaf == "tid2eid":
                p.copy_(torch.argsort(torch.rand(p.shape[0], n_experts, generator=g), 1)[:, :p.shape[1]])
            elif leaf == "e_score_correction_bias":
                p.copy_(0.3 * rn(*p.shape))
            elif leaf == "sinks":
                p.copy_(1.0 + rn(*p.shape))
            elif leaf == "position_bias":
                p.copy_(rn(*p.shape))
            elif leaf in ("fn", "hc_fn"):
                p.copy_(rn(*p.shape) / math.sqrt(p.shape[1]))
            elif leaf in ("scale", "hc_scale"):
                p.copy_(0.3 + 0.3 * torch.rand(*p.shape, generator=g))
            elif leaf in ("base", "hc_base"):
                b = 0.5 * rn(*p.shape)
                if p.shape[0] == (2 + n) * n:      # comb part leans to the identity, as in synth
                    b[2 * n:] += 2.0 * torch.eye(n).reshape(-1)
                p.copy_(b)
            elif leaf == "gate_up_proj":
                p.copy_(rn(*p.shape) * 6.0 / math.sqrt(p.shape[2]))
            elif leaf == "down_proj":
                p.copy_(rn(*p.shape) / math.sqrt(p.shape[2]))
            elif name == "model.embed_tokens.weight":
                p.copy_(rn(*p.shape))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * rn(*p.shape))
            elif p.dim() == 2:
                gain = 3.0 if name == "lm_head.weight" else 1.0
                if "shared_experts" in name and "down_proj" not in name:
                    gain = 6.0
                p.copy_(rn(*p.shape) * gain / math.sqrt(p.shape[1]))
            else:
                raise AssertionError(f"no draw for {name} {tuple(p.shape)}")
        for name, p in model.named_parameters():
            if name.endswith("indexer.q_b_proj.weight"):   # heads h and h + Hi/2 opposite: no 0-score ties
                w = p.view(n_heads_idx, -1, p.shape[1])
                w[n_heads_idx // 2:] = -w[: n_heads_idx // 2]


def build_tf_tiny(out: Path):
    """(the transformers model in fp32 eval mode, the directory of its hf checkpoint)."""
    from safetensors.torch import save_file
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    cfg = preset("tiny")
    d = cfg.to_transformers_dict()
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()     # tiny max_position vs YaRN's original length: a harmless warning
    try:
        torch.manual_seed(0)
        tf = DeepseekV4ForCausalLM(DeepseekV4Config(**d)).float().eval()
    finally:
        hf_logging.set_verbosity(level)
    redraw(tf, cfg.index_n_heads, cfg.hc_mult, cfg.n_routed_experts)
    save_file({k: v.contiguous() for k, v in tf.state_dict().items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(d))
    from dsv4.tokenizer import build_tiny_tokenizer, write_tokenizer

    write_tokenizer(build_tiny_tokenizer(vocab_size=cfg.vocab_size, fill=True), out)   # for prompt rendering
    return tf, out
