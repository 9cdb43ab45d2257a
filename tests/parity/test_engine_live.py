"""Dumps from inside an engine (parity.engines.live and the vLLM / SGLang plugins), on module trees
with the engines' names (stand-ins, not the engines: neither installs on a CPU machine) and on
stand-ins of the engines' own plugin entry points (vLLM's ModelRegistry, SGLang's HookRegistry),
whose signatures were read from vLLM 0.33.0 / SGLang 0.5.23 (docs/engines.md)."""
from __future__ import annotations

import inspect
import json
import sys
import types
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from parity.dumps import read_dump
from parity.engines import live, sglang_map, sglang_plugin, vllm_map, vllm_plugin

D, V, E = 8, 16, 4


class _Ffn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared_experts = torch.nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * self.shared_experts(x)


class _Layer(torch.nn.Module):
    def __init__(self, engine: str) -> None:
        super().__init__()
        if engine == "vllm":
            self.attn, self.ffn = torch.nn.Linear(D, D), _Ffn()
        else:
            self.self_attn, self.mlp = torch.nn.Linear(D, D), torch.nn.Module()
            self.mlp.gate, self.mlp.shared_experts = torch.nn.Linear(D, E, bias=False), torch.nn.Linear(D, D)


class StandIn(torch.nn.Module):
    """vLLM's or SGLang's DeepSeek-V4 names, flat tokens, forward(input_ids, positions, ...)."""

    def __init__(self, engine: str, n_layers: int = 2) -> None:
        super().__init__()
        self.engine = engine
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(V, D)
        self.model.layers = torch.nn.ModuleList(_Layer(engine) for _ in range(n_layers))
        self.model.norm = torch.nn.LayerNorm(D)
        self.logits_processor = torch.nn.Linear(D, V)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, *_: object) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            if self.engine == "vllm":
                x = x + layer.attn(x)
                x = x + layer.ffn(x)
            else:
                x = x + layer.self_attn(x)
                layer.mlp.gate(x)
                x = x + layer.mlp.shared_experts(x)
        return self.model.norm(x)

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:   # vLLM: after forward, its own call
        return self.logits_processor(h)


def _settings(tmp_path: Path, **kw) -> live.LiveSettings:
    return live.LiveSettings(tmp_path / "dumps", **kw)


def test_one_dump_per_prefill_with_the_prefills_ids_decode_steps_skipped(tmp_path: Path) -> None:
    m = StandIn("sglang")
    d = live.LiveDump(m, live.engine_rows(m, sglang_map), _settings(tmp_path), engine="sglang-test",
                      table="parity/engines/sglang_map.py")
    ids = torch.tensor([3, 1, 4, 1, 5])
    with torch.no_grad():
        out = m(ids, torch.arange(5))
        m(torch.tensor([9]), torch.tensor([5]))          # a decode step: no pass
        m(torch.tensor([2, 7]), torch.arange(2))         # a second prefill: over max_dumps=1
    d.detach()
    assert len(d.written) == 1
    dump = read_dump(d.written[0])
    assert dump.manifest["token_ids"] == ids.tolist() and dump.manifest["probe_subset"] is True
    assert set(dump.probes) == {f"layers.{i}.{p}" for i in range(2) for p in ("attn.out", "ffn.router.logits",
                                                                              "ffn.shared.out")} | \
        {"embed", "hc_head", "final_norm"}
    assert torch.equal(dump.probes["final_norm"], out)


def test_vllm_logits_after_forward_land_in_their_pass_and_pruned_rows_are_left_out(tmp_path: Path,
                                                                                  caplog) -> None:
    m = StandIn("vllm")
    d = live.LiveDump(m, live.engine_rows(m, vllm_map), _settings(tmp_path, max_dumps=2), engine="vllm-test",
                      table="parity/engines/vllm_map.py")
    with torch.no_grad():
        h = m(torch.arange(6), torch.arange(6))
        logits = m.compute_logits(h)                     # prompt_logprobs=0: every row
        h2 = m(torch.arange(4), torch.arange(4))
        m.compute_logits(h2[-1:])                        # the sampled row only
    d.detach()
    first, second = (read_dump(p) for p in d.written)
    assert torch.equal(first.probes["logits"], logits) and len(first.manifest["token_ids"]) == 6
    assert "logits" not in second.probes and "embed" in second.probes
    assert "probe logits left out of the dump: 1 rows, the pass has 4 tokens" in caplog.text


def test_a_table_module_the_model_lacks_is_one_error_before_any_hook(tmp_path: Path) -> None:
    m = StandIn("vllm")
    with pytest.raises(ValueError, match=r"expected modules \['model.layers.0.self_attn'.*another engine version"):
        live.LiveDump(m, live.engine_rows(m, sglang_map), _settings(tmp_path), engine="x", table="t")
    assert not m._forward_pre_hooks and not m.model.embed_tokens._forward_hooks


@pytest.mark.parametrize("env, message", [({"DSV4_PARITY_DUMP_MAX": "0"}, "positive integer, found '0'"),
                                          ({"DSV4_PARITY_DUMP_MAX": "x"}, "positive integer, found 'x'"),
                                          ({"DSV4_PARITY_DUMP_MODE": "chatty"}, r"\['chat', 'thinking'\], found 'chatty'")])
def test_bad_environment_is_one_clear_error(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        live.settings_from_env({"DSV4_PARITY_DUMP_DIR": "/tmp/x", **env})
    assert live.settings_from_env({}) is None


def test_both_plugins_are_installed_under_the_engines_entry_point_groups() -> None:
    got = {g: {ep.value for ep in entry_points(group=g)} for g in ("vllm.general_plugins", "sglang.srt.plugins")}
    assert "parity.engines.vllm_plugin:register" in got["vllm.general_plugins"]
    assert "parity.engines.sglang_plugin:register" in got["sglang.srt.plugins"]


def _fake_modules(monkeypatch, modules: dict[str, dict]) -> None:
    for name, attrs in modules.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)


def test_sglang_plugin_hooks_the_init_of_the_pinned_class_and_dumps(tmp_path: Path, monkeypatch) -> None:
    registered = []

    class HookType:
        AFTER = "after"

    class HookRegistry:
        @staticmethod
        def register(target, hook, hook_type):
            registered.append((target, hook, hook_type))

    _fake_modules(monkeypatch, {"sglang": {"__version__": sglang_map.VERSION},
                                "sglang.srt.plugins.hook_registry": {"HookRegistry": HookRegistry, "HookType": HookType}})
    monkeypatch.delenv("DSV4_PARITY_DUMP_DIR", raising=False)
    sglang_plugin.register()
    assert registered == []                               # not switched on: nothing registered
    monkeypatch.setenv("DSV4_PARITY_DUMP_DIR", str(tmp_path))
    sglang_plugin.register()
    (target, hook, kind), = registered
    assert target == "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM.__init__" and kind == "after"
    tree = json.loads((Path(sglang_map.__file__).parent / sglang_map.TREE).read_text())   # the pinned source
    assert sglang_map.ROOT in tree["classes"] and "sglang/srt/models/deepseek_v4.py" in tree["files"]
    m = StandIn("sglang")
    hook(None, m, object())                               # what SGLang's AFTER wrapper calls
    with torch.no_grad():
        m(torch.arange(5), torch.arange(5))
    (path,) = m._dsv4_parity_dump.written
    assert read_dump(path).engine == f"sglang-{sglang_map.VERSION}"


def test_vllm_plugin_registers_a_lazy_subclass_of_vllms_class_that_dumps(tmp_path: Path, monkeypatch) -> None:
    calls = []

    class ModelRegistry:
        @staticmethod
        def register_model(arch, cls):
            calls.append((arch, cls))

    class Base(StandIn):
        def __init__(self, *, vllm_config=None, prefix=""):
            super().__init__("vllm")

    _fake_modules(monkeypatch, {"vllm": {"__version__": "0.34.0", "ModelRegistry": ModelRegistry},
                                "vllm.models.deepseek_v4": {"DeepseekV4ForCausalLM": Base}})
    monkeypatch.setattr(vllm_plugin, "_built", {})
    monkeypatch.setenv("DSV4_PARITY_DUMP_DIR", str(tmp_path))
    vllm_plugin.register()
    (arch, name), = calls
    assert arch == "DeepseekV4ForCausalLM" and name == "parity.engines.vllm_plugin:DumpingDeepseekV4ForCausalLM"
    mod, cls_name = name.split(":")
    cls = getattr(sys.modules[mod], cls_name)             # what vLLM's lazy loader does
    assert issubclass(cls, Base)
    # what vLLM's loader checks before it calls cls(vllm_config=..., prefix=...) (initialize_model)
    assert {"vllm_config", "prefix"} <= set(inspect.signature(cls.__init__).parameters)
    m = cls(vllm_config=None, prefix="")
    with torch.no_grad():
        m.compute_logits(m(torch.arange(6), torch.arange(6)))
    (path,) = m._dsv4_parity_dump.written                # complete at the logits: written at once
    assert read_dump(path).engine == "vllm-0.34.0"
    assert {"logits", "layers.1.ffn.out", "layers.0.attn.out"} <= set(read_dump(path).probes)
