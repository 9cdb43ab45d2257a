"""The native NVFP4 model: ``load_model`` builds it from a checkpoint and a precision plan; the surface
is the one of ``docs/model_surface.md`` (shared with the BF16 reference).

Building (``_Builder``) is the only place where plan formats are looked up: each weight is converted
to its class's format (``dsv4.weights``) and wrapped in the layer class of that format. Every FP4
GEMM goes through a ``Dispatcher`` of the requested backend, which counts what ran
(``kernel_log``); ``assert_kernels_ran`` fails when an FP4-planned module never reached it.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import torch

from . import probes
from .checkpoint.names import component_class
from .checkpoint.reader import CheckpointReader, open_checkpoint
from .checkpoint.synth import resolve_preset
from .config import PRESETS as CONFIG_PRESETS, REAL_PRESETS, DSV4Config, check_token_ids, layer_devices
from .kernels.registry import get_backend
from .layers.attention import Attention
from .layers.block import Block
from .layers.compressor import Compressor
from .layers.dispatch import Dispatcher, KernelLog, KernelsNotRunError
from .layers.grouped_linear import GROUPED_CLASSES, GroupedLinear
from .layers.head import Head
from .layers.indexer import Indexer
from .layers.kv_cache import KV_STORAGES, LayerCache, WindowCache
from .layers.linear import ACT_SCALE_POLICIES, LINEAR_CLASSES, Linear
from .layers.mhc import HCHead, HyperConnection
from .layers.moe import MoE
from .layers.norm import RMSNorm
from .layers.rope import Rope, rope_omega
from .layers.router import HashRouter, Router
from .layers.shared_expert import SharedExpert
from .plan import INDEXER_QK_TREATMENT, PrecisionPlan, resolve_plan
from .weights import ConversionRecord, prepare, prepare_bank, split_rows

log = logging.getLogger(__name__)
ACT_DTYPE = torch.bfloat16   # the activation dtype of every plan but the all-fp32 logic plan
_ACT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class DecodeState:
    """Token ids so far and every layer's caches. The pending chunk is ``token_ids[start:]``; after a
    complete forward every cache has ``length == pos``."""

    token_ids: torch.Tensor
    start: int
    layers: list[LayerCache] = field(default_factory=list)

    @property
    def pos(self) -> int:
        """Number of positions in the state (the position of the next appended token)."""
        return int(self.token_ids.shape[0])

    @property
    def chunk(self) -> torch.Tensor:
        return self.token_ids[self.start:]


class _Builder:
    """Reads the checkpoint and builds layer objects under one plan."""

    def __init__(self, reader: CheckpointReader, plan: PrecisionPlan, devices: Mapping[Any, str],
                 dispatchers: Mapping[str, Dispatcher], act_scale: str) -> None:
        self.r, self.c, self.plan = reader, reader.config, plan
        self.devices, self.dispatchers, self.act_scale = devices, dispatchers, act_scale
        self.records: list[ConversionRecord] = []

    def klass(self, trunk_class: str) -> str:
        """The plan class a weight of ``trunk_class`` is built under (the trunk's own; the DSpark stage
        builder maps it to the draft's)."""
        return trunk_class

    def _extra(self, fmt: str, device: str) -> dict[str, Any]:
        return {"dispatcher": self.dispatchers[device], "act_scale": self.act_scale} if fmt == "fp4" else {}

    def tensor(self, name: str, layer: int | None, device: str) -> torch.Tensor:
        return self.r.weight(name, layer).tensors["weight"].to(device)

    def norm(self, name: str, layer: int | None, device: str) -> RMSNorm:
        return RMSNorm(self.tensor(name, layer, device), self.c.rms_norm_eps)

    def linear(self, names: Sequence[str], layer: int | None, device: str, *,
               out_dtype: torch.dtype = ACT_DTYPE, component: str | None = None) -> Linear:
        """One linear over the row-concatenation of ``names`` (one name, or ``[w1, w3]``), in the plan
        format of ``component`` (default: the class the names imply)."""
        comp = component or self.klass(component_class(names[0]))
        fmt = self.plan[comp]
        label = _label(names, layer)
        w = prepare([self.r.weight(n, layer) for n in names], fmt, name=label, component=comp, records=self.records,
                    device=torch.device(device))
        return LINEAR_CLASSES[fmt](label, comp, w, out_dtype=out_dtype, **self._extra(fmt, device))

    def grouped(self, groups: Sequence[Any], name: str, comp: str, device: str) -> GroupedLinear:
        fmt = self.plan[comp]
        w = prepare_bank(groups, fmt, name=name, component=comp, records=self.records, device=torch.device(device))
        return GROUPED_CLASSES[fmt](name, comp, w, len(groups), **self._extra(fmt, device))

    def compressor(self, base: str, layer: int, device: str, *, width: int, rope: Rope) -> Compressor:
        ratio = self.c.compress_ratio(layer)
        f32 = torch.float32   # the official compressor computes in FP32 (spec §6)
        return Compressor(_label([base], layer), self.linear([base + ".wkv"], layer, device, out_dtype=f32),
                          self.linear([base + ".wgate"], layer, device, out_dtype=f32),
                          self.tensor(base + ".ape", layer, device), self.norm(base + ".norm", layer, device),
                          ratio=ratio, overlap=ratio == self.c.csa_ratio, width=width, rope=rope)

    def attention(self, i: int, device: str) -> Attention:
        c, ratio = self.c, self.c.compress_ratio(i)
        rope = Rope(rope_omega(c, compressed=ratio > 0).to(device), c.qk_rope_head_dim)
        compressor = self.compressor("attn.compressor", i, device, width=c.head_dim, rope=rope) if ratio else None
        indexer = None
        if ratio == c.csa_ratio:
            indexer = Indexer(
                f"layers.{i}.", self.linear(["attn.indexer.wq_b"], i, device),
                self.linear(["attn.indexer.weights_proj"], i, device, out_dtype=torch.float32),
                self.compressor("attn.indexer.compressor", i, device, width=c.index_head_dim, rope=rope), rope,
                n_heads=c.index_n_heads, head_dim=c.index_head_dim, topk=c.index_topk, ratio=ratio,
                qk_treatment=INDEXER_QK_TREATMENT[self.plan["indexer_q"]])
        wo_a = self.grouped([[g] for g in split_rows(self.r.weight("attn.wo_a", i), c.o_groups)],
                            f"layers.{i}.attn.wo_a", self.klass("attn_o"), device)
        return Attention(
            f"layers.{i}.", wq_a=self.linear(["attn.wq_a"], i, device), q_norm=self.norm("attn.q_norm", i, device),
            wq_b=self.linear(["attn.wq_b"], i, device), wkv=self.linear(["attn.wkv"], i, device),
            kv_norm=self.norm("attn.kv_norm", i, device), wo_a=wo_a, wo_b=self.linear(["attn.wo_b"], i, device),
            sink=self.tensor("attn.attn_sink", i, device), rope=rope,
            kv_storage=KV_STORAGES[self.plan["kv_cache"]](c.head_dim, c.qk_rope_head_dim),
            compressor=compressor, indexer=indexer, n_heads=c.num_attention_heads, head_dim=c.head_dim,
            o_groups=c.o_groups, window=c.sliding_window, ratio=ratio, eps=c.rms_norm_eps)

    def moe(self, i: int, device: str, hashed: bool | None = None) -> MoE:
        c = self.c
        gate = self.linear(["ffn.gate"], i, device, out_dtype=torch.float32)   # FP32 logits (spec §9 step 1)
        kw = dict(topk=c.num_experts_per_tok, route_scale=c.routed_scaling_factor)
        router = (HashRouter(f"layers.{i}.", gate, tid2eid=self.tensor("ffn.gate.tid2eid", i, device), **kw)
                  if (c.is_hash_layer(i) if hashed is None else hashed) else
                  Router(f"layers.{i}.", gate, bias=self.tensor("ffn.gate.bias", i, device), **kw))
        E = c.n_routed_experts
        # each expert read when its turn comes (weights.prepare_bank): a layer's bank is never on the host whole
        def expert(e: int, *parts: str) -> Any:
            return lambda: [self.r.weight(f"ffn.experts.{e}.{p}", i) for p in parts]

        w13 = self.grouped([expert(e, "w1", "w3") for e in range(E)], f"layers.{i}.ffn.experts.w13",
                           self.klass("routed_experts"), device)
        w2 = self.grouped([expert(e, "w2") for e in range(E)], f"layers.{i}.ffn.experts.w2",
                          self.klass("routed_experts"), device)
        shared = SharedExpert(f"layers.{i}.ffn.shared_experts",
                              self.linear(["ffn.shared_experts.w1", "ffn.shared_experts.w3"], i, device),
                              self.linear(["ffn.shared_experts.w2"], i, device), swiglu_limit=c.swiglu_limit)
        return MoE(f"layers.{i}.", router, w13, w2, shared, n_experts=E, swiglu_limit=c.swiglu_limit)

    def hc(self, which: str, i: int, device: str) -> HyperConnection:
        c = self.c
        return HyperConnection(*(self.tensor(f"hc_{which}_{p}", i, device) for p in ("fn", "base", "scale")),
                               n=c.hc_mult, iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps, rms_eps=c.rms_norm_eps)

    def block(self, i: int) -> Block:
        dev = self.devices[i]
        return Block(i, hc_attn=self.hc("attn", i, dev), attn_norm=self.norm("attn_norm", i, dev),
                     attention=self.attention(i, dev), hc_ffn=self.hc("ffn", i, dev),
                     ffn_norm=self.norm("ffn_norm", i, dev), moe=self.moe(i, dev), device=torch.device(dev))

    def head(self) -> Head:
        dev, c = self.devices["head"], self.c
        hc = HCHead(*(self.tensor(f"hc_head_{p}", None, dev) for p in ("fn", "base", "scale")),
                    hc_eps=c.hc_eps, rms_eps=c.rms_norm_eps)
        return Head(hc, self.norm("norm", None, dev), self.linear(["head"], None, dev, out_dtype=torch.float32))


def _label(names: Sequence[str], layer: int | None) -> str:
    base = names[0] if len(names) == 1 else names[0].rsplit(".", 1)[0] + "." + "".join(
        n.rsplit(".", 1)[1] for n in names)
    return base if layer is None else f"layers.{layer}.{base}"


class NativeModel:
    """See module docstring and docs/model_surface.md."""

    side = "native"

    def __init__(self, *, reader: CheckpointReader, plan: PrecisionPlan, backend: str, devices: dict[Any, str],
                 dispatchers: dict[str, Dispatcher], kernel_log: KernelLog, act_scale: str, embed: torch.Tensor,
                 blocks: list[Block | None], head: Head | None, conversions: list[ConversionRecord],
                 only: list[Any] | None = None) -> None:
        self.config: DSV4Config = reader.config
        self.plan = plan
        self.backend = backend
        self.device_map = devices
        self.dispatchers = dispatchers
        self._log = kernel_log
        self.act_scale = act_scale
        self.embed_weight = embed
        self.blocks = blocks
        self.head_module = head
        self.conversion_records = conversions
        self.only = only                     # None: every part built
        self.checkpoint_path = str(reader.path)
        self.flavor = reader.flavor
        self.act_dtype = _ACT_DTYPES[plan.act_dtype]
        self.fingerprint = reader.fingerprint()

    # ---- bookkeeping ---------------------------------------------------------------------------
    @property
    def conversions(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.conversion_records]

    @property
    def kernel_log(self) -> Counter:
        """``Counter[(component, backend, op)]`` of kernel calls since load (or ``reset_kernel_log``)."""
        return self._log.counts

    def reset_kernel_log(self) -> None:
        self._log.reset()

    def backend_names(self) -> dict[str, str]:
        return {dev: d.name for dev, d in self.dispatchers.items()}

    def switch_backend(self, backend: str) -> None:
        """The same built weights on another backend from now on, instead of building them again from the
        checkpoint (the harness's bug-budget column reuses the floor column's model this way): every
        device's dispatcher takes the new backend, frozen activation scales and the kernel log start
        over, and every FP4 module is expected on the new backend. A device without that backend raises
        before anything changes."""
        new = {dev: get_backend(backend, dev) for dev in self.dispatchers}
        for dev, d in self.dispatchers.items():
            d.backend = new[dev]
        for obj in layer_objects([self.blocks, self.head_module]):
            if getattr(obj, "frozen_scale", None) is not None:
                obj.frozen_scale = None
        getattr(self.blocks, "forget_frozen", lambda: None)()   # a streamed model's kept ones (dsv4.streamed)
        self._log.reset()
        name = next(iter(new.values())).name if new else backend
        for module, (comp, _) in list(self._log.expected.items()):
            self._log.expected[module] = (comp, name)
        self.backend = backend

    def assert_kernels_ran(self) -> None:
        """Raise ``KernelsNotRunError`` if any FP4-planned module never ran its GEMM and its activation
        quantization on the backend it was built with."""
        missing = self._log.missing()
        if missing:
            raise KernelsNotRunError(f"plan {self.plan.name!r}: {len(missing)} FP4 module(s) never reached their "
                                     f"backend: " + "; ".join(missing[:12]) + (" ..." if len(missing) > 12 else ""))

    def describe(self) -> dict[str, Any]:
        actions = Counter(r.action for r in self.conversion_records)
        return {
            "side": self.side, "config": self.config.name, "checkpoint": self.checkpoint_path,
            "flavor": self.flavor, "ignored_config_keys": list(self.config.ignored_keys),
            "fingerprint": self.fingerprint, "plan": self.plan.name,
            "plan_key": self.plan.key(), "plan_components": dict(self.plan.components),
            "backend": self.backend, "backends": self.backend_names(), "act_scale": self.act_scale,
            "dtype": str(self.act_dtype).replace("torch.", ""), "logits_dtype": "float32",
            "devices": {str(k): v for k, v in self.device_map.items()},
            "conversions": dict(actions),
        }

    # ---- validation ----------------------------------------------------------------------------
    def _ids(self, ids: Any, *, batch: bool = False) -> torch.Tensor:
        check_token_ids(self.config, ids)
        if ids.dim() == 2 and not batch:
            raise ValueError(f"input_ids: expected shape [T] here (use model(ids) for [B, T]), found {tuple(ids.shape)}")
        return ids.to(torch.int64)

    def _check_state(self, state: DecodeState) -> None:
        if not isinstance(state, DecodeState) or len(state.layers) != len(self.blocks):
            raise ValueError(f"state: expected a DecodeState from new_state/prefill of this model, found {state!r}")

    # ---- the surface ---------------------------------------------------------------------------
    def new_state(self, ids: torch.Tensor) -> DecodeState:
        ids = self._ids(ids)
        return DecodeState(ids.to("cpu"), 0, [LayerCache(WindowCache(self.config.sliding_window))
                                              for _ in range(len(self.blocks))])

    def _built(self, part: Any, obj: Any) -> Any:
        if obj is None:   # a pipeline rank's share (load_model(only=...)) lacks this part
            raise ValueError(f"{part}: expected a part this model built, found it outside only={self.only}")
        return obj

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        ids = self._ids(ids)
        self._built("embed", self.embed_weight)
        e = self.embed_weight[ids.to(self.embed_weight.device)].to(self.act_dtype)
        probes.emit("embed", e)
        return e[:, None, :].expand(-1, self.config.hc_mult, -1).contiguous()

    def layer(self, i: int, X: torch.Tensor, state: DecodeState) -> torch.Tensor:
        c = self.config
        self._check_state(state)
        if not (isinstance(i, int) and 0 <= i < len(self.blocks)):
            raise ValueError(f"layer index: expected 0..{len(self.blocks) - 1}, found {i!r}")
        T = state.pos - state.start
        want = (T, c.hc_mult, c.hidden_size)
        if not isinstance(X, torch.Tensor) or tuple(X.shape) != want or not X.is_floating_point():
            raise ValueError(f"layer {i} X: expected a float tensor of shape {list(want)}, found "
                             f"{type(X).__name__ if not isinstance(X, torch.Tensor) else (X.dtype, list(X.shape))}")
        cache = state.layers[i]
        if cache.length != state.start:
            raise ValueError(f"layer {i}: expected its cache at position {state.start} (the chunk start), found "
                             f"{cache.length} (was this chunk already run through layer {i}?)")
        block = self._built(f"layer {i}", self.blocks[i])
        X = X.to(block.device, self.act_dtype)
        return block(X, cache, state.start, state.chunk.to(block.device))

    def head(self, X: torch.Tensor) -> torch.Tensor:
        c = self.config
        if not isinstance(X, torch.Tensor) or X.dim() != 3 or tuple(X.shape[1:]) != (c.hc_mult, c.hidden_size):
            raise ValueError(f"head X: expected [T, {c.hc_mult}, {c.hidden_size}], found "
                             f"{list(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__}")
        return self._built("head", self.head_module)(X.to(self.device_map["head"], self.act_dtype))

    def _forward(self, state: DecodeState) -> torch.Tensor:
        X = self.embed(state.chunk)
        for i in range(len(self.blocks)):
            X = self.layer(i, X, state)
        return self.head(X)

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, DecodeState]:
        state = self.new_state(ids)
        return self._forward(state), state

    def decode_step(self, state: DecodeState, token_id: int) -> torch.Tensor:
        self.begin_decode_step(state, token_id)
        return self._forward(state)[0]

    def begin_decode_step(self, state: DecodeState, token_id: int) -> None:
        """decode_step's checks and bookkeeping (before any compute): append the token, set ``start``.
        The CUDA-graph decoder calls it too, then runs the step piecewise."""
        self._check_state(state)
        tid = int(token_id.item() if isinstance(token_id, torch.Tensor) else token_id)
        if not 0 <= tid < self.config.vocab_size:
            raise ValueError(f"token_id: expected an id in [0, {self.config.vocab_size}), found {tid}")
        if state.pos >= self.config.max_position_embeddings:
            raise ValueError(f"decode_step: expected pos < max_position_embeddings="
                             f"{self.config.max_position_embeddings}, found {state.pos}")
        stale = [i for i, lc in enumerate(state.layers) if lc.length != state.pos]
        if stale:
            raise ValueError(f"decode_step: expected every layer's cache at position {state.pos}, found layers "
                             f"{stale} behind (finish the pending chunk first)")
        state.start = state.pos
        state.token_ids = torch.cat((state.token_ids, torch.tensor([tid], dtype=torch.int64)))

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = self._ids(input_ids, batch=True)
        if ids.dim() == 2:
            return torch.stack([self.prefill(row)[0] for row in ids])
        return self.prefill(ids)[0]

    def __repr__(self) -> str:
        return (f"NativeModel({self.config.name!r}, plan={self.plan.name!r}, backend={self.backend_names()}, "
                f"act_scale={self.act_scale!r})")


def layer_objects(root: Any) -> list[Any]:
    """Every layer object under ``root`` (blocks, head, their linears, norms, caches' formats), each once,
    depth first in model order; tensors, scalars and the shared dispatchers are not descended into."""
    seen: set[int] = set()
    out: list[Any] = []
    todo = [root]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen or isinstance(obj, (torch.Tensor, str, int, float, type, Dispatcher)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            todo.extend(reversed(obj))
        elif isinstance(obj, dict):
            todo.extend(reversed(list(obj.values())))
        elif hasattr(obj, "__dict__"):
            out.append(obj)
            todo.extend(reversed(list(vars(obj).values())))
    return out


def set_act_dtype(root: Any, dtype: torch.dtype) -> None:
    """Set ``act_dtype`` on every layer object under ``root`` that declares one (the classes default to
    BF16; the all-fp32 logic plan computes everything in FP32)."""
    for obj in layer_objects(root):
        if hasattr(type(obj), "act_dtype"):
            obj.act_dtype = dtype


def resolve_checkpoint(path_or_preset: str | Path) -> Path:
    """A preset name (tiny presets are synthesized) or a checkpoint path."""
    s = str(path_or_preset)
    if s in CONFIG_PRESETS:
        if s in REAL_PRESETS:
            raise ValueError(f"preset {s!r}: expected a checkpoint directory for the real model sizes "
                             f"{REAL_PRESETS} (there is no built-in {s} checkpoint), found only the preset name")
        return resolve_preset(s, "nvidia-nvfp4", 0)
    p = Path(s)
    if not p.exists():
        raise ValueError(f"checkpoint: expected a preset {sorted(CONFIG_PRESETS)} or an existing path, found {s!r}")
    return p


def load_model(path_or_preset: str | Path, *, plan: Any = "default", backend: str = "auto", device: str = "cpu",
               device_map: Mapping[Any, str] | None = None, act_scale: str = "static",
               only: Collection[Any] | None = None) -> NativeModel:
    """Build the native model. Every argument is validated before any weight is converted.

    ``only``: build just these parts (layer indices, 'embed', 'head'; a pipeline rank's share,
    parity/pipeline.py); the others stay None and calling them is an error."""
    plan_obj = resolve_plan(plan)
    if act_scale not in ACT_SCALE_POLICIES:
        raise ValueError(f"act_scale: expected one of {ACT_SCALE_POLICIES}, found {act_scale!r}")
    reader = open_checkpoint(resolve_checkpoint(path_or_preset))
    cfg = reader.config
    devices = layer_devices(cfg, device, device_map)
    klog = KernelLog()
    dispatchers = {dev: Dispatcher(get_backend(backend, dev), klog) for dev in sorted(set(devices.values()))}
    keys = list(devices) if only is None else list(only)
    bad = [k for k in keys if k not in devices]
    if bad:
        raise ValueError(f"only: expected layer indices 0..{cfg.num_hidden_layers - 1}, 'embed' or 'head', found {bad}")
    b = _Builder(reader, plan_obj, devices, dispatchers, act_scale)
    blocks = [b.block(i) if i in keys else None for i in range(cfg.num_hidden_layers)]
    head = b.head() if "head" in keys else None
    act = _ACT_DTYPES[plan_obj.act_dtype]
    embed = b.tensor("embed", None, devices["embed"]).to(act) if "embed" in keys else None
    if act != ACT_DTYPE:
        set_act_dtype([blocks, head], act)
    model = NativeModel(reader=reader, plan=plan_obj, backend=backend, devices=devices, dispatchers=dispatchers,
                        kernel_log=klog, act_scale=act_scale, embed=embed, blocks=blocks, head=head,
                        conversions=b.records, only=None if only is None else keys)
    log.info("loaded %s", model)
    return model
