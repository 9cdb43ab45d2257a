"""Engine probe tables resolve in the engine's module tree at the pinned version (read from its
source by parity.engines.module_tree), and the shared hook mechanism writes a dump the contract
accepts from a module tree with those names. vLLM itself is not installed here (a CUDA build), so
this is what has run for it: docs/engines.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from parity.dumps import read_dump, write_dump
from parity.engines import hooks, vllm_map
from parity.engines.module_tree import classes_of

TREES = Path(vllm_map.__file__).parent


def _resolve(tree: dict, root: str, path: str, factories: dict) -> str:
    """The class at ``path`` (dots; a digit steps into a list) from class ``root``; raises naming the step."""
    cls = root
    for step in path.split("."):
        if step.isdigit():
            continue
        attrs = tree["classes"][cls]["attrs"]
        assert step in attrs, f"{cls} has no sub-module {step!r} (path {path})"
        held = [factories.get(c, c) for c in attrs[step]["classes"]]
        known = [c for c in held if c in tree["classes"]]
        cls = known[0] if known else held[0]
    return cls


@pytest.mark.parametrize("root, layer_rows, global_rows", [
    (vllm_map.ROOT, vllm_map.LAYER_PROBES, vllm_map.GLOBAL_PROBES),
    (vllm_map.DSPARK_ROOT, vllm_map.DSPARK_LAYER_PROBES, vllm_map.DSPARK_GLOBAL_PROBES),
])
def test_every_vllm_row_resolves_in_the_pinned_source(root, layer_rows, global_rows) -> None:
    tree = json.loads((TREES / vllm_map.TREE).read_text())
    assert tree["package"] == f"vllm=={vllm_map.VERSION}" and tree["files"]
    ends = {}
    for probe, path, kind, layout in hooks.layer_rows(layer_rows, "model.layers", 1) + list(global_rows):
        ends[probe.removeprefix("layers.0.")] = _resolve(tree, root, path, vllm_map.FACTORIES)
        assert kind in ("in", "out") and layout == "rows"
    assert ends.get("attn.out") == "DeepseekV4Attention" and ends.get("ffn.out") == "DeepseekV4MoE"
    assert ends.get("ffn.shared.out") == "DeepseekV4MLP"
    if root == vllm_map.ROOT:
        assert ends["embed"] == "VocabParallelEmbedding" and ends["final_norm"] == "RMSNorm"
        assert ends["logits"] == "LogitsProcessor"


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
