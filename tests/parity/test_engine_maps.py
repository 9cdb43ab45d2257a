"""Engine probe tables resolve in the engine's module tree at the pinned version (read from its
source by parity.engines.module_tree), and the shared hook mechanism writes a dump the contract
accepts from a module tree with those names. vLLM and SGLang are not installed here (CUDA builds),
so this is what has run for them: docs/engines.md."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from parity.dumps import read_dump, write_dump
from parity.engines import hooks, sglang_map, vllm_map
from parity.engines.module_tree import aliases_of, classes_of, resolve_path

TREES = Path(vllm_map.__file__).parent
# (engine map, root, layer rows, layers path, global rows, the classes the rows must end at)
_ENDS = {"attn.out": ("DeepseekV4Attention", "MQALayer", "DSparkAttention"), "ffn.out": ("DeepseekV4MoE",),
         "ffn.shared.out": ("DeepseekV4MLP", "DeepseekV2MLP"), "ffn.router.logits": ("MoEGate",),
         "embed": ("VocabParallelEmbedding",), "final_norm": ("RMSNorm",), "hc_head": ("RMSNorm",),
         "logits": ("LogitsProcessor",), "dspark.hc_head": ("RMSNorm",), "dspark.join": ("RMSNorm",),
         "dspark.main_hidden": ("ReplicatedLinear",)}
_TABLES = [(m, m.ROOT, m.LAYER_PROBES, m.LAYERS_PATH, m.GLOBAL_PROBES) for m in (vllm_map, sglang_map)] + \
    [(m, m.DSPARK_ROOT, m.DSPARK_LAYER_PROBES, m.DSPARK_LAYERS_PATH, m.DSPARK_GLOBAL_PROBES) for m in (vllm_map, sglang_map)]


@pytest.mark.parametrize("engine, root, layer_rows, layers_path, global_rows", _TABLES,
                         ids=[f"{t[0].__name__.split('.')[-1]}-{t[1]}" for t in _TABLES])
def test_every_engine_row_resolves_in_the_pinned_source(engine, root, layer_rows, layers_path, global_rows) -> None:
    tree = json.loads((TREES / engine.TREE).read_text())
    name = engine.__name__.split(".")[-1].removesuffix("_map")
    assert tree["package"] == f"{name}=={engine.VERSION}" and tree["files"]
    rows = hooks.layer_rows(layer_rows, layers_path, 1) + hooks.fill_rows(global_rows, last=2)
    for probe, path, kind, layout in rows:
        end = resolve_path(tree, root, path, engine.FACTORIES)
        assert end in _ENDS[probe.removeprefix("layers.0.")], f"{engine.__name__}: {probe} at {path} ends at {end}"
        assert kind in ("in", "out") and layout == "rows"
    names = {probe.removeprefix("layers.0.") for probe, *_ in rows}
    assert {"attn.out", "ffn.shared.out"} <= names


def test_sglang_builders_and_aliases_pick_the_cuda_stage_attention() -> None:
    """The stage overrides the layer's attention builder (DSparkAttention, not the trunk's MQALayer),
    and the CUDA alias of the decoder layer is taken: the resolver's two facts, on SGLang's tree."""
    tree = json.loads((TREES / sglang_map.TREE).read_text())
    assert resolve_path(tree, sglang_map.ROOT, "model.layers.3.self_attn") == "MQALayer"
    assert resolve_path(tree, sglang_map.DSPARK_ROOT, "stages.0.self_attn") == "DSparkAttention"
    assert resolve_path(tree, sglang_map.ROOT, "model.layers.0") == "DeepseekV4CudaDecoderLayer"
    with pytest.raises(LookupError, match="has no sub-module 'ffn'"):
        resolve_path(tree, sglang_map.ROOT, "model.layers.0.ffn")


def test_the_tree_reader_records_sub_modules_lists_and_factories() -> None:
    src = '''
class Layer(nn.Module):
    def __init__(self):
        self.attn = pick_attn(cfg)(cfg)
        self.ffn = MoE(cfg)
class Model(nn.Module):
    def __init__(self):
        self.start, self.end, self.layers = make_layers(4, lambda prefix: Layer(prefix))
        self.extra = nn.ModuleList([Layer(p) for p in range(2)])
        self.more, self.start_layer, self.end_layer = make_pp_layers(2, lambda idx, prefix: Layer(prefix))
        self.norm = RMSNorm(8)
'''
    c = classes_of(src)
    assert c["Model"]["attrs"]["layers"] == {"classes": ["Layer"], "list": True}
    assert c["Model"]["attrs"]["extra"] == {"classes": ["Layer"], "list": True}
    assert c["Model"]["attrs"]["more"] == {"classes": ["Layer"], "list": True} and "end_layer" not in c["Model"]["attrs"]
    assert "start" not in c["Model"]["attrs"] and c["Layer"]["attrs"]["attn"]["classes"] == ["pick_attn()"]
    assert c["Layer"]["builders"] == {} and aliases_of("L = A if cuda else B\nN = 3\nM = Cls\n") == {"L": ["A", "B"], "M": ["Cls"]}
    src2 = "class Base(nn.Module):\n    def build(self):\n        return Attn(1)\n    def other(self, x):\n        return x\n"
    assert classes_of(src2)["Base"]["builders"] == {"build": "Attn"}


class _Mirror(torch.nn.Module):
    """A module tree with vLLM 0.33.0's names (not vLLM's code): what the hooks see in a vLLM process."""

    def __init__(self, T: int, D: int, V: int, L: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(V, D)
        self.model.layers = torch.nn.ModuleList()
        for _ in range(L):
            layer = torch.nn.Module()
            layer.attn = torch.nn.Linear(D, D)
            layer.ffn = torch.nn.Module()
            layer.ffn.shared_experts = torch.nn.Linear(D, D)
            self.model.layers.append(layer)
        self.model.norm = torch.nn.LayerNorm(D)
        self.logits_processor = torch.nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = x + layer.attn(x)
            x = x + layer.ffn.shared_experts(x)
        return self.logits_processor(self.model.norm(x))


def test_hooks_from_the_vllm_table_write_a_dump_the_contract_accepts(tmp_path: Path) -> None:
    T, D, V, L = 6, 8, 16, 2
    m = _Mirror(T, D, V, L)
    ids = torch.arange(T)
    rows = hooks.layer_rows([r for r in vllm_map.LAYER_PROBES if r[1] != "ffn"], "model.layers", L) + \
        list(vllm_map.GLOBAL_PROBES)
    got = hooks.capture(m, rows, lambda: m(ids), table="parity/engines/vllm_map.py")
    assert set(got) == {"layers.0.attn.out", "layers.1.attn.out", "layers.0.ffn.shared.out", "layers.1.ffn.shared.out",
                        "embed", "hc_head", "final_norm", "logits"}
    assert torch.equal(got["logits"], m(ids).detach())
    d = write_dump(tmp_path / "d", got, engine="vllm-0.33.0-mirror", token_ids=ids.tolist(), prompt_mode="chat",
                   probe_subset=True)
    assert set(read_dump(d).probes) == set(got)
    with pytest.raises(ValueError, match="expected a module 'model.layers.0.self_attn'.*another engine version"):
        hooks.capture(m, hooks.layer_rows([("attn.out", "self_attn", "out", "rows")], "model.layers", 1),
                      lambda: m(ids), table="parity/engines/vllm_map.py")


class _AttnOutput(NamedTuple):
    partial: torch.Tensor


class _SglangAttn(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> _AttnOutput:   # SGLang's MQALayer may return AttnOutput(o)
        return _AttnOutput(super().forward(x))


class _SglangMirror(torch.nn.Module):
    """A module tree with SGLang 0.5.23's names (not SGLang's code)."""

    def __init__(self, D: int, V: int, E: int, L: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(V, D)
        self.model.layers = torch.nn.ModuleList()
        for _ in range(L):
            layer = torch.nn.Module()
            layer.self_attn = _SglangAttn(D, D)
            layer.mlp = torch.nn.Module()
            layer.mlp.gate = torch.nn.Linear(D, E, bias=False)
            layer.mlp.shared_experts = torch.nn.Linear(D, D)
            self.model.layers.append(layer)
        self.model.norm = torch.nn.LayerNorm(D)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = x + layer.self_attn(x).partial
            layer.mlp.gate(x)
            x = x + layer.mlp.shared_experts(x)
        return self.model.norm(x * 2)


def test_hooks_from_the_sglang_table_write_a_dump_the_contract_accepts(tmp_path: Path) -> None:
    T, D, V, E, L = 5, 8, 16, 4, 2
    m = _SglangMirror(D, V, E, L)
    ids = torch.arange(T)
    rows = hooks.layer_rows(sglang_map.LAYER_PROBES, sglang_map.LAYERS_PATH, L) + list(sglang_map.GLOBAL_PROBES)
    got = hooks.capture(m, rows, lambda: m(ids), table="parity/engines/sglang_map.py")
    assert set(got) == {f"layers.{i}.{p}" for i in range(L) for p in ("attn.out", "ffn.router.logits", "ffn.shared.out")} \
        | {"embed", "hc_head", "final_norm"}
    x = m.model.embed_tokens(ids)
    assert torch.equal(got["layers.0.attn.out"], m.model.layers[0].self_attn(x).partial.detach())
    assert torch.equal(got["final_norm"], m(ids).detach()) and got["layers.1.ffn.router.logits"].shape == (T, E)
    d = write_dump(tmp_path / "d", got, engine="sglang-0.5.23-mirror", token_ids=ids.tolist(), prompt_mode="chat",
                   probe_subset=True)
    assert set(read_dump(d).probes) == set(got)
