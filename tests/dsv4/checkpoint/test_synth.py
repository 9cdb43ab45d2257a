"""Synthetic checkpoints: determinism, caching, CLI, and the properties the tiny model must have."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.synth import resolve_preset, synth
from dsv4.config import preset


def _digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


def test_same_arguments_byte_identical(tmp_path):
    a = synth("tiny", "official", tmp_path / "a", seed=3)
    b = synth("tiny", "official", tmp_path / "b", seed=3)
    c = synth("tiny", "official", tmp_path / "c", seed=4)
    assert _digest(a) == _digest(b)
    assert _digest(a)["model.safetensors"] != _digest(c)["model.safetensors"]
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(_digest(a))


def test_cli_writes_a_readable_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "dsv4.checkpoint.synth", "--preset", "tiny", "--flavor", "hf",
                        "--quant", "nvfp4", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert open_checkpoint(out).flavor == "hf"
    bad = subprocess.run([sys.executable, "-m", "dsv4.checkpoint.synth", "--preset", "flash", "--out",
                          str(tmp_path / "x")], capture_output=True, text=True)
    assert bad.returncode == 2 and "config-only" in bad.stderr


def test_resolve_preset_caches_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_PARITY_CACHE", str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", "from dsv4.checkpoint.synth import resolve_preset as r; "
                               "print(r('tiny', 'official', 7))"], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(outs) == 1
    d = Path(outs.pop())
    assert d.name.startswith("tiny-official-s7-v")
    assert [p.name for p in tmp_path.iterdir()] == [d.name]   # no temporary directory left behind
    before = _digest(d)
    assert resolve_preset("tiny", "official", 7) == d and _digest(d) == before


# ---- tiny-preset properties that need no forward pass (forward-based ones live in tests/reference) -----
def test_tiny_respects_official_kernel_constraints():
    c = preset("tiny")
    assert (c.head_dim - c.qk_rope_head_dim) % 64 == 0                          # kv FP8 block of 64
    assert c.index_head_dim >= 32 and c.index_head_dim & (c.index_head_dim - 1) == 0   # Hadamard, FP4/32
    for dim in (c.hidden_size, c.q_lora_rank, c.num_attention_heads * c.head_dim, c.head_dim,
                c.o_groups * c.o_lora_rank, c.wo_a_group_in, c.moe_intermediate_size):
        assert dim % 128 == 0, dim                                               # FP8 128x128 blocks
    assert c.hc_mult == 4
    assert c.routed_scaling_factor != 1.0
    assert c.sliding_window >= c.hca_ratio                                       # §6 causality rule
    kinds = [c.layer_kind(i) for i in range(c.num_hidden_layers)]
    assert {"window", "csa", "hca"} <= set(kinds)
    hashed = [c.is_hash_layer(i) for i in range(c.num_hidden_layers)]
    assert any(hashed) and not all(hashed)


def test_tiny_exercises_every_layer_kind_in_the_standard_prompts():
    from dsv4.prompts import load_prompt_set
    from dsv4.tokenizer import tiny_tokenizer

    c, tok = preset("tiny"), tiny_tokenizer()
    for p in load_prompt_set():
        t = len(tok.encode(p.render()))
        assert t // c.hca_ratio >= 2, (p.id, t)            # HCA: >= 2 compressed entries
        assert t // c.csa_ratio > c.index_topk, (p.id, t)  # CSA: top-k smaller than the available blocks
        assert t > c.sliding_window                        # some keys only reachable through compression


def test_tiny_block_scales_non_uniform_and_non_square(tmp_path):
    r = open_checkpoint(synth("tiny", "nvidia-nvfp4", tmp_path))
    s = r.weight("attn.wq_a", 1).tensors["scale"]
    assert s.shape[0] != s.shape[1]                                     # non-square 128x128 grid
    fp8_exps = torch.cat([r.weight(n, 2).tensors["scale"].view(torch.uint8).flatten()
                          for n in ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b")])
    assert fp8_exps.unique().numel() >= 3                               # non-uniform block scales
    nv = r.weight("ffn.experts.1.w1", 3).tensors["weight_scale"].float()
    assert nv.unique().numel() > 10 and nv.shape[0] != nv.shape[1]
