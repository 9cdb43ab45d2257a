"""The BF16 reference model (spec §3): embedding into hc_mult streams, blocks of mHC + attention +
MoE, hc_head, final norm, fp32 logits. Weights stream from the lazy reader layer by layer.

Surface: docs/model_surface.md. Imports only compute-free parts of dsv4 (design principle 2)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from dsv4 import probes
from dsv4.checkpoint.reader import CheckpointReader, open_checkpoint
from dsv4.checkpoint.synth import resolve_preset
from dsv4.config import PRESETS, REAL_PRESETS, DSV4Config, check_device_map, check_token_ids, layer_devices

from .attention import Attention, AttentionShape, AttentionWeights
from .compressor import Compressor, CompressorWeights
from .indexer import Indexer, IndexerWeights
from .mhc import hc_head, hc_post, hc_pre
from .moe import MoE
from .ops import mm, rms_norm
from .profiles import Profile, gemm_quantizes_input, get_profile
from .rope import RopeSpec, rope_spec
from .state import CompressorState, LayerCache, ReferenceState
from .weights import LayerWeights, WeightStore

DTYPES = (torch.bfloat16, torch.float32)
AUTO_CACHE_BYTES = 256 * 1024 * 1024   # cache_weights=None: cache checkpoints up to this size
_DTYPE_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2, "F8_E4M3": 1,
                "F8_E5M2": 1, "F8_E8M0": 1, "U8": 1, "I8": 1, "BOOL": 1}
# Linears whose input the official profile may quantize; expert 0 stands for every routed expert.
_QUANT_NAMES = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b", "ffn.shared_experts.w1",
                "ffn.experts.0.w1")


class ReferenceModel:
    """One checkpoint under one numerics profile. See docs/model_surface.md for the calls."""

    side = "reference"

    def __init__(self, reader: CheckpointReader, *, profile: Profile, dtype: torch.dtype,
                 devices: dict[Any, str], cache_weights: bool) -> None:
        self.reader, self.config, self.profile, self.dtype = reader, reader.config, profile, dtype
        self.devices = devices
        self.store = WeightStore(reader, dtype, cache_weights)
        self.fingerprint = reader.fingerprint()
        c = self.config
        self._quant = {n: profile.act_quant and gemm_quantizes_input(c, n) for n in _QUANT_NAMES}
        self._shape = AttentionShape(c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.sliding_window,
                                     c.o_groups, c.o_lora_rank, c.rms_norm_eps)

    # ---- description ------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"side": self.side, "profile": self.profile.name, "plan": None, "backend": "torch-reference",
                "dtype": str(self.dtype).removeprefix("torch."), "device": self.devices["embed"],
                "devices": {str(k): v for k, v in self.devices.items()}, "config_name": self.config.name,
                "checkpoint": str(self.reader.path), "flavor": self.reader.flavor,
                "ignored_config_keys": list(self.config.ignored_keys),
                "fingerprint": self.fingerprint, "cache_weights": self.store.cache,
                # fp32 islands assume IEEE fp32 matmuls; "high"/"medium" (TF32/bf16) would change them
                "fp32_matmul_precision": torch.get_float32_matmul_precision()}

    # ---- state ---------------------------------------------------------------------------------
    def new_state(self, ids: torch.Tensor) -> ReferenceState:
        """Token ids of a prefill from position 0 and empty caches (§6 decode state, §8 ring)."""
        self._check_1d(ids)
        caches = []
        for i in range(self.config.num_hidden_layers):
            kind = self.config.layer_kind(i)
            caches.append(LayerCache(compressor=None if kind == "window" else CompressorState(),
                                     indexer=CompressorState() if kind == "csa" else None))
        return ReferenceState(ids.detach().to("cpu", torch.int64), 0, caches)

    # ---- the three stages ------------------------------------------------------------------------
    @torch.no_grad()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """§3/§4 initialisation: embedding rows copied, unscaled, into hc_mult streams [T, n, D]."""
        self._check_1d(ids)
        dev = self.devices["embed"]
        e = self.store.get("embed", None, dev)[ids.to(dev, torch.int64)].to(self.dtype)
        probes.emit("embed", e)
        self.store.release()
        return e.unsqueeze(1).expand(-1, self.config.hc_mult, -1).contiguous()

    @torch.no_grad()
    def layer(self, i: int, x: torch.Tensor, state: ReferenceState) -> torch.Tensor:
        """§3 Block_i on the tokens of ``state`` (positions state.start..state.pos−1); extends layer i's caches."""
        c = self.config
        cache = state.layers[i]
        if cache.pos != state.start:
            raise RuntimeError(f"layer {i}: its cache holds {cache.pos} tokens but this call starts at position "
                               f"{state.start} (layer run twice, or out of order?)")
        T = int(state.ids.shape[0])
        if tuple(x.shape) != (T, c.hc_mult, c.hidden_size) or not x.is_floating_point():
            raise ValueError(f"layer {i} input: expected float streams [{T}, {c.hc_mult}, {c.hidden_size}], "
                             f"found {x.dtype} {list(x.shape)}")
        dev = self.devices[i]
        x = x.to(dev, self.dtype)
        lw = LayerWeights(self.store, i, dev)
        positions = state.positions(dev)
        hc = dict(n=c.hc_mult, iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps, rms_eps=c.rms_norm_eps)

        h, post, comb = hc_pre(x, lw("hc_attn_fn"), lw("hc_attn_scale"), lw("hc_attn_base"), **hc)
        probes.emit(f"layers.{i}.hc.attn.pre", h)
        a = self._attention(i, lw)(rms_norm(h, lw("attn_norm", True), c.rms_norm_eps), positions, cache, i)
        x = hc_post(a, x, post, comb)
        probes.emit(f"layers.{i}.hc.attn.post", x)

        h, post, comb = hc_pre(x, lw("hc_ffn_fn"), lw("hc_ffn_scale"), lw("hc_ffn_base"), **hc)
        probes.emit(f"layers.{i}.hc.ffn.pre", h)
        f = self._moe(i, lw)(rms_norm(h, lw("ffn_norm", True), c.rms_norm_eps), state.ids.to(dev), i)
        x = hc_post(f, x, post, comb)
        probes.emit(f"layers.{i}.out", x)
        cache.pos = state.pos
        self.store.release()
        return x

    @torch.no_grad()
    def head(self, x: torch.Tensor) -> torch.Tensor:
        """§10: hc_head collapse, final RMSNorm, fp32 logits against the (untied) head."""
        c = self.config
        if x.dim() != 3 or tuple(x.shape[1:]) != (c.hc_mult, c.hidden_size):
            raise ValueError(f"head input: expected streams [T, {c.hc_mult}, {c.hidden_size}], found {list(x.shape)}")
        dev = self.devices["head"]
        g = LayerWeights(self.store, None, dev)
        x = x.to(dev, self.dtype)
        y = hc_head(x, g("hc_head_fn"), g("hc_head_scale"), g("hc_head_base"), hc_eps=c.hc_eps,
                    rms_eps=c.rms_norm_eps)
        probes.emit("hc_head", y)
        y = rms_norm(y, g("norm", True), c.rms_norm_eps)
        probes.emit("final_norm", y)
        logits = mm(y, g("head", True).T).float()
        probes.emit("logits", logits)
        self.store.release()
        return logits

    # ---- whole-model calls ---------------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, ReferenceState]:
        """Logits [T, V] fp32 of a prompt from position 0, and the state to decode from."""
        state = self.new_state(ids)
        return self._run(state), state

    def decode_step(self, state: ReferenceState, token_id: int) -> torch.Tensor:
        """Logits [V] of one token appended at position ``state.pos``; updates the caches."""
        c = self.config
        if isinstance(token_id, torch.Tensor):
            token_id = int(token_id.reshape(()))
        if not isinstance(token_id, int) or not 0 <= token_id < c.vocab_size:
            raise ValueError(f"token_id: expected an int in [0, {c.vocab_size}), found {token_id!r}")
        pos = state.pos
        if pos + 1 > c.max_position_embeddings:
            raise ValueError(f"decode_step: expected at most max_position_embeddings={c.max_position_embeddings} "
                             f"tokens, found position {pos}")
        if any(lc.pos != pos for lc in state.layers):
            raise RuntimeError(f"decode_step: every layer cache must hold {pos} tokens, found "
                               f"{[lc.pos for lc in state.layers]}")
        state.ids, state.start = torch.tensor([token_id], dtype=torch.int64), pos
        return self._run(state)[0]

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> fp32 logits [T, V]; [B, T] -> [B, T, V] (one prefill per row)."""
        check_token_ids(self.config, input_ids)
        if input_ids.dim() == 1:
            return self.prefill(input_ids)[0]
        return torch.stack([self.prefill(row)[0] for row in input_ids])

    # ---- internals ------------------------------------------------------------------------------------
    def _run(self, state: ReferenceState) -> torch.Tensor:
        x = self.embed(state.ids)
        for i in range(self.config.num_hidden_layers):
            x = self.layer(i, x, state)
        return self.head(x)

    def _check_1d(self, ids: torch.Tensor) -> None:
        check_token_ids(self.config, ids)
        if ids.dim() != 1:
            raise ValueError(f"input_ids: expected shape [T] here, found {list(ids.shape)}")

    def _compressor(self, lw: LayerWeights, prefix: str, ratio: int, rope: RopeSpec) -> Compressor:
        w = CompressorWeights(lw(f"{prefix}.wkv", True), lw(f"{prefix}.wgate", True), lw(f"{prefix}.ape"),
                              lw(f"{prefix}.norm", True))
        return Compressor(w, ratio, ratio == self.config.csa_ratio, rope, self.config.rms_norm_eps)

    def _attention(self, i: int, lw: LayerWeights) -> Attention:
        c = self.config
        kind, ratio = c.layer_kind(i), c.compress_ratio(i)
        rope = rope_spec(c, kind)
        w = AttentionWeights(lw("attn.wq_a"), lw("attn.q_norm", True), lw("attn.wq_b"), lw("attn.wkv"),
                             lw("attn.kv_norm", True), lw("attn.wo_a"), lw("attn.wo_b"), lw("attn.attn_sink"))
        compressor = self._compressor(lw, "attn.compressor", ratio, rope) if ratio else None
        indexer = None
        if kind == "csa":
            iw = IndexerWeights(lw("attn.indexer.wq_b"), lw("attn.indexer.weights_proj"))
            indexer = Indexer(iw, self._compressor(lw, "attn.indexer.compressor", ratio, rope),
                              n_heads=c.index_n_heads, head_dim=c.index_head_dim, topk=c.index_topk, ratio=ratio,
                              rope=rope, fp4=self.profile.indexer_fp4, quant_wq_b=self._quant["attn.indexer.wq_b"])
        return Attention(w, self._shape, rope, kind=kind, ratio=ratio, compressor=compressor, indexer=indexer,
                         kv_fp8=self.profile.kv_fp8, quant=self._quant)

    def _moe(self, i: int, lw: LayerWeights) -> MoE:
        return build_moe(lw, self.config, self._quant, hashed=self.config.is_hash_layer(i))


def build_moe(lw: Any, c: DSV4Config, quant: Mapping[str, bool], *, hashed: bool) -> MoE:
    """§9 for one block whose weights ``lw(name)`` serves (a trunk layer or a DSpark stage)."""

    def experts(e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return lw(f"ffn.experts.{e}.w1"), lw(f"ffn.experts.{e}.w3"), lw(f"ffn.experts.{e}.w2")

    shared = (lw("ffn.shared_experts.w1"), lw("ffn.shared_experts.w3"), lw("ffn.shared_experts.w2"))
    return MoE(lw("ffn.gate"), None if hashed else lw("ffn.gate.bias"), lw("ffn.gate.tid2eid") if hashed else None,
               experts, shared, k=c.num_experts_per_tok, scale=c.routed_scaling_factor, limit=c.swiglu_limit,
               quant_routed=quant["ffn.experts.0.w1"], quant_shared=quant["ffn.shared_experts.w1"])


def _resolve(path_or_preset: str | Path) -> Path:
    if isinstance(path_or_preset, str) and path_or_preset in PRESETS:
        if path_or_preset in REAL_PRESETS:
            raise ValueError(f"preset {path_or_preset!r}: a real model has no built-in weights; expected the path "
                             f"of its checkpoint directory, found only the preset name")
        return resolve_preset(path_or_preset, flavor="nvidia-nvfp4", seed=0)
    p = Path(path_or_preset)
    if not p.exists():
        raise ValueError(f"checkpoint: expected a directory, a .safetensors file or a preset name "
                         f"({sorted(PRESETS)}), found {str(path_or_preset)!r}")
    return p


def _stored_bytes(reader: CheckpointReader) -> int:
    total = 0
    for name in reader.tensor_names():
        info = reader.tensor_info(name)
        n = 1
        for s in info.shape:
            n *= s
        total += n * _DTYPE_BYTES.get(info.dtype, 4)
    return total


def load_model(path_or_preset: str | Path, *, profile: str = "bf16", dtype: torch.dtype = torch.bfloat16,
               device: str = "cpu", device_map: Mapping[Any, str] | None = None,
               cache_weights: bool | None = None) -> ReferenceModel:
    """The reference model of a checkpoint directory / .safetensors file / tiny preset name.

    ``profile``: 'bf16' or 'official' (reference/profiles.py); ``dtype``: activation dtype, bf16 or
    fp32; ``device_map``: {layer | 'embed' | 'head': device}, missing keys take ``device``;
    ``cache_weights``: keep dequantized weights between calls; None = on for checkpoints of at most
    256 MiB of tensors (the tiny presets), off otherwise (streaming). Every argument is checked before
    any weight is read."""
    prof = get_profile(profile)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected torch.bfloat16 or torch.float32, found {dtype!r}")
    reader = open_checkpoint(_resolve(path_or_preset))
    config: DSV4Config = reader.config
    devices = layer_devices(config, device, device_map)
    check_device_map(config, devices)   # also validates the default device
    if cache_weights is None:
        cache_weights = _stored_bytes(reader) <= AUTO_CACHE_BYTES
    return ReferenceModel(reader, profile=prof, dtype=dtype, devices=devices, cache_weights=cache_weights)
