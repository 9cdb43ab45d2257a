"""Built-in synthetic checkpoints: deterministic, offline, in any of the three flavors.

``python -m dsv4.checkpoint.synth --preset tiny --flavor nvidia-nvfp4 --out DIR --seed 0``

Values come from numpy's PCG64 (one stream per tensor, keyed by seed and tensor name), so the same
arguments give byte-identical files across torch versions. Quantized formats are produced here with
a small self-contained encoder (the reference and the native side each have their own decoder; this
module must not import ``dsv4.numerics`` because the reference resolves presets through it).
Magnitudes are chosen so a forward stays well-conditioned and every known bug is observable (some
SwiGLU inputs beyond the limit, sinks on the scale of the scores, non-uniform block scales).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch
    from ..config import DSV4Config
    Values = Callable[["WeightSpec"], np.ndarray]   # a weight's logical fp32 values (int64: hash table)


from ..atomic_io import file_mode
from .cache import cache_root  # noqa: F401  (re-exported: callers import it from here)
from .errors import CheckpointError
from .flavors import stored_base
from .layouts import FLAVORS, get_layout
from .names import INDEX, LINEAR, NORM, PARAM, TABLE, WeightSpec, all_weights

log = logging.getLogger(__name__)

SYNTH_VERSION = 3
DEFAULT_SHARD_BYTES = 64 * 1024 * 1024
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(_E2M1_VALUES, _E2M1_VALUES[1:]))


# ---- deterministic values ---------------------------------------------------------------------------
def _rng(seed: int, name: str) -> np.random.Generator:
    import numpy as np

    return np.random.Generator(np.random.PCG64([seed, zlib.crc32(name.encode())]))


# Gains per weight: output RMS ~ gain for unit-RMS inputs. Sub-layer outputs (wo_b, w2) are small
# against the residual streams, as in trained models; with unit gains every layer rewrites the
# streams and the tiny model amplifies NVFP4 noise into a top-1 agreement near 40 % (measured),
# which would bury the floor-column faults. w1/w3 push some SwiGLU inputs past swiglu_limit.
_GAINS = {"head": 4.0, "ffn.gate": 1.0, "w1": 1.4, "w3": 1.4, "w2": 0.1, "wo_b": 0.1}


def _normal_rows(g: np.random.Generator, shape: tuple[int, int], scale: float, rows: int = 8192) -> np.ndarray:
    """``(g.standard_normal(shape) * scale).astype(float32)`` drawn a block of rows at a time: the
    generator fills C order, so the values are the same, without a full-size float64 temporary
    (a real-width vocabulary table would need 4 GB of it)."""
    import numpy as np

    out = np.empty(shape, np.float32)
    for r in range(0, shape[0], rows):
        block = g.standard_normal((min(rows, shape[0] - r), shape[1]))
        block *= scale
        out[r:r + rows] = block
    return out


def _linear_values(spec: WeightSpec, seed: int) -> np.ndarray:
    import numpy as np

    n, k = spec.shape
    g = _rng(seed, spec.full_name)
    leaf = spec.name.rsplit(".", 1)[-1]
    gain = _GAINS.get(spec.name, _GAINS.get(leaf, 1.0))
    w = g.standard_normal((n, k))
    w *= gain / np.sqrt(k)   # in place: the same products, one float64 temporary fewer
    # Non-uniform block magnitudes: FP8 128x128 and FP4 16/32-wide scales all differ.
    bm = 2.0 ** g.uniform(-0.7, 0.7, size=(-(-n // 128), -(-k // 128)))
    w *= _blocks_of(bm, 128, 128, (n, k))
    w *= 2.0 ** g.uniform(-0.4, 0.4, size=(n, 1))
    return w.astype(np.float32)


def synthetic_values(spec: WeightSpec, c: DSV4Config, seed: int) -> np.ndarray:
    """The deterministic synthetic values of one weight (fp32; int64 for the hash table)."""
    import numpy as np

    g = _rng(seed, spec.full_name)
    if spec.name.startswith(("markov_head.", "confidence_head.")):   # DSpark heads: small low-rank tables
        return (g.standard_normal(spec.shape) / np.sqrt(spec.shape[-1])).astype(np.float32)
    leaf = spec.name.rsplit(".", 1)[-1]
    if spec.kind == LINEAR:
        return _linear_values(spec, seed)
    if spec.kind == NORM:
        return (1.0 + 0.1 * g.standard_normal(spec.shape)).astype(np.float32)
    if spec.kind == TABLE:
        scale = 1.0 if spec.name == "embed" else _GAINS["head"] / np.sqrt(spec.shape[1])
        return _normal_rows(g, spec.shape, scale)
    if spec.kind == INDEX:   # tid2eid: distinct experts per token id
        v, k = spec.shape
        return np.argsort(g.random((v, c.n_routed_experts)), axis=1)[:, :k].astype(np.int64)
    # raw fp32 parameters
    if leaf.endswith("_fn"):
        return (g.standard_normal(spec.shape) / np.sqrt(spec.shape[1])).astype(np.float32)
    if leaf.endswith("_scale"):
        return (0.3 + 0.3 * g.random(spec.shape)).astype(np.float32)
    if leaf.endswith("_base"):
        n = c.hc_mult
        b = 0.5 * g.standard_normal(spec.shape)
        if spec.shape[0] == c.hc_mix_dim:   # comb part: favour the identity so streams stay distinct
            b[2 * n:] += 2.0 * np.eye(n).reshape(-1)
        return b.astype(np.float32)
    if leaf == "attn_sink":   # scores q.k/sqrt(d) are ~N(0,1); sinks compete with ~10-40 keys
        return (2.5 + g.standard_normal(spec.shape)).astype(np.float32)
    if leaf == "ape":
        return g.standard_normal(spec.shape).astype(np.float32)
    if leaf == "bias":        # selection-only correction bias, comparable to score gaps
        return (0.3 * g.standard_normal(spec.shape)).astype(np.float32)
    raise CheckpointError(f"synth: no generator for parameter {spec.full_name}")


# ---- encoders (self-contained; see module docstring) ---------------------------------------------
def _e2m1_codes(v: np.ndarray) -> np.ndarray:
    """Round to the E2M1 grid, nearest with ties to the even code; saturate at 6 (NaN -> 0).

    Thresholds instead of distances to all 8 values: the midpoints are exact in any float dtype, so
    ``a <= mid`` decides like the distance comparison and a tie (``a == mid``) goes to the even code."""
    import numpy as np

    a = np.minimum(np.abs(v), 6.0)
    mid = np.asarray(_E2M1_MIDPOINTS, dtype=a.dtype)
    mag = np.searchsorted(mid, a, side="left")
    odd_tie = (mag % 2 == 1) & (a == mid[np.minimum(mag, len(mid) - 1)])
    mag = (mag + odd_tie).astype(np.uint8)
    mag[np.isnan(a)] = 0
    return mag | np.where((v < 0) & (mag > 0), 8, 0).astype(np.uint8)


def _pack(codes: np.ndarray) -> np.ndarray:
    import numpy as np

    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _e4m3(x: np.ndarray) -> torch.Tensor:
    import numpy as np
    import torch

    return torch.from_numpy(np.clip(x, -448.0, 448.0).astype(np.float32)).to(torch.float8_e4m3fn)


def _pow2_exponent(amax: np.ndarray, qmax: float) -> np.ndarray:
    import numpy as np

    return np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax)).astype(np.int64)


def _blocks_of(e: np.ndarray, rows: int, cols: int, shape: tuple[int, int]) -> np.ndarray:
    """A per-block grid blown up to element resolution, cropped to ``shape``."""
    import numpy as np

    return np.repeat(np.repeat(e, rows, axis=0), cols, axis=1)[: shape[0], : shape[1]]


# The encoders work in the values' own dtype (fp32 for every writer here): block maxima and
# divisions by powers of two are exact, so the bytes equal a float64 computation's; only the
# exponent's log2 is taken in float64.
def encode_fp8_block(w: np.ndarray) -> dict[str, torch.Tensor]:
    import numpy as np
    import torch

    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    pad = np.zeros((nb * 128, kb * 128), w.dtype)
    pad[:n, :k] = w
    amax = np.abs(pad.reshape(nb, 128, kb, 128)).max(axis=(1, 3)).astype(np.float64)
    e = _pow2_exponent(amax, 448.0)
    q = w / _blocks_of((2.0 ** e).astype(w.dtype), 128, 128, (n, k))
    return {"weight": _e4m3(q), "scale": torch.from_numpy((e + 127).astype(np.uint8)).view(torch.float8_e8m0fnu)}


def encode_mxfp4(w: np.ndarray) -> dict[str, torch.Tensor]:
    import numpy as np
    import torch

    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    e = _pow2_exponent(np.abs(blocks).max(axis=2).astype(np.float64), 6.0)
    codes = _e2m1_codes(blocks / (2.0 ** e).astype(w.dtype)[..., None]).reshape(n, k)
    return {"weight": torch.from_numpy(_pack(codes).view(np.int8)),
            "scale": torch.from_numpy((e + 127).astype(np.uint8)).view(torch.float8_e8m0fnu)}


# Static activation scale written for NVFP4 experts: a generous amax bound for RMS-normed inputs.
# Block scales keep their relative precision over E4M3's range, so a loose bound costs nothing.
_INPUT_AMAX_BOUND = 32.0


def encode_nvfp4(w: np.ndarray, global_scale: float | None = None) -> dict[str, torch.Tensor]:
    """ModelOpt recipe: global = amax/(6*448); block scale = E4M3(block amax / (6 * global))."""
    import numpy as np
    import torch

    n, k = w.shape
    w64 = w.astype(np.float64)
    gs = np.float32(np.abs(w64).max() / (6.0 * 448.0)) if global_scale is None else np.float32(global_scale)
    blocks = w64.reshape(n, k // 16, 16)
    sf = _e4m3((np.abs(blocks).max(axis=2) / (6.0 * float(gs))).astype(np.float32))
    denom = sf.to(torch.float32).numpy().astype(np.float64)[..., None] * float(gs)
    codes = _e2m1_codes(np.where(denom > 0, blocks / np.where(denom > 0, denom, 1.0), 0.0)).reshape(n, k)
    return {"weight": torch.from_numpy(_pack(codes)), "weight_scale": sf,
            "weight_scale_2": torch.tensor(float(gs), dtype=torch.float32),
            "input_scale": torch.tensor(_INPUT_AMAX_BOUND / (6.0 * 448.0), dtype=torch.float32)}


# ---- flavors (each one a layout of layouts.py) -------------------------------------------------------
def linear_format(spec: WeightSpec, c: DSV4Config, flavor: str, quant: str) -> str:
    name = spec.name
    # BF16 in every release: the router, the indexer's weights_proj, the compressors (spec §2.3)
    if name in ("ffn.gate", "attn.indexer.weights_proj") or ".compressor." in f".{name}":
        return "bf16"
    layout = get_layout(flavor)
    ruled = layout.rule_format(spec.full_name)   # compressed-tensors: per module, as published
    if ruled is not None:
        return ruled
    if layout.naming == "tf-saved":   # transformers' own save: unquantized, in the model dtype
        return "bf16"
    if flavor == "hf":
        if quant == "bf16":
            return "bf16"
        if spec.is_expert:
            return "nvfp4" if quant == "nvfp4" else "fp8"
        return "fp8" if quant == "fp8" else "bf16"
    if spec.is_expert:
        if layout.expert_format == "nvfp4" and spec.mtp is None:
            return "nvfp4"          # MTP experts stay MXFP4 (spec §2.4)
        return {"fp4": "mxfp4", "fp8": "fp8", None: "bf16"}[c.expert_dtype]
    return "fp8" if c.dtype == "fp8" else "bf16"


def _nvfp4_global(v: np.ndarray, flavor: str, amax: float | None = None) -> float:
    """The dequantization multiplier the reader will hand out. compressed-tensors stores the reciprocal
    2688/amax; the reader takes 1/x in FP32, so encode with exactly that multiplier."""
    import numpy as np

    a = float(np.abs(v).max()) if amax is None else amax
    if get_layout(flavor).global_scale != "reciprocal":
        return float(np.float32(a / (6.0 * 448.0)))
    one = np.float32(1.0)
    mult = one / np.float32(6.0 * 448.0 / a)
    for _ in range(4):   # a multiplier whose FP32 reciprocal round-trips, so the stored 1/x is exact
        if one / (one / mult) == mult:
            return float(mult)
        mult = one / (one / mult)
    return float(2.0 ** np.ceil(np.log2(a / 2688.0)))


def role_names(spec: WeightSpec, roles: Iterable[str], flavor: str) -> dict[str, str]:
    """The stored tensor name of each role of ``spec`` in layout ``flavor`` (the writer's naming)."""
    layout = get_layout(flavor)
    hf_named = layout.naming != "official" and spec.mtp is None
    base = stored_base(spec, layout.naming)
    roles = list(roles)
    if spec.kind in (PARAM, INDEX):
        return {"weight": base}
    if spec.kind != LINEAR:
        return {"weight": base + ".weight"}
    suffix = dict(layout.roles) if hf_named or spec.mtp is None else dict(get_layout("official").roles)
    if "weight_scale_2" not in roles:      # not NVFP4: the plain suffixes of its naming scheme
        suffix["weight"] = ".weight"
        if spec.mtp is None and layout.fp8_roles:   # and the layout's own FP8-block suffixes
            suffix.update(layout.fp8_roles)
    return {r: base + suffix[r] for r in roles}


def _store_roles(spec: WeightSpec, roles: dict[str, torch.Tensor], flavor: str) -> dict[str, torch.Tensor]:
    import torch

    layout = get_layout(flavor)
    if layout.fp8_scale_dtype == "F32" and "scale" in roles and roles["weight"].dtype == torch.float8_e4m3fn:
        roles = dict(roles, scale=roles["scale"].to(torch.float32))   # 2^(e-127): exact in FP32
    if layout.global_scale == "reciprocal" and "weight_scale_2" in roles:
        # the published export's global scales are 0-d (its post-processing squeezed compressed-tensors' [1])
        roles = dict(roles, weight_scale_2=(1.0 / roles["weight_scale_2"].to(torch.float32)).reshape(()),
                     input_scale=(1.0 / roles["input_scale"].to(torch.float32)).reshape(()))
    names = role_names(spec, roles, flavor)
    return {names[r]: t for r, t in roles.items()}


def _stored(spec: WeightSpec, c: DSV4Config, flavor: str, quant: str, v: np.ndarray) -> dict[str, torch.Tensor]:
    import torch

    if spec.kind == LINEAR:
        fmt = linear_format(spec, c, flavor, quant)
        if fmt == "fp8":
            roles = encode_fp8_block(v)
        elif fmt == "mxfp4":
            roles = encode_mxfp4(v)
        elif fmt == "nvfp4":
            roles = encode_nvfp4(v, _nvfp4_global(v, flavor))
        else:
            roles = {"weight": torch.from_numpy(v).to(torch.bfloat16)}
    elif spec.kind in (PARAM, INDEX):
        roles = {"weight": torch.from_numpy(v)}
    else:
        roles = {"weight": torch.from_numpy(v).to(torch.bfloat16)}
    return _store_roles(spec, roles, flavor)


def _units(specs: list[WeightSpec], c: DSV4Config, flavor: str, quant: str) -> list[tuple[WeightSpec, ...]]:
    """Weights encoded together: an expert's NVFP4 w1 and w3 share weight_scale_2 (vLLM expects it;
    spec §2.4), so they are one unit encoded with the larger global scale; every other weight alone."""
    by_name = {s.full_name: s for s in specs}
    paired = {s.full_name[:-1] + "3" for s in specs
              if s.is_expert and s.name.endswith(".w1") and linear_format(s, c, flavor, quant) == "nvfp4"}
    units: list[tuple[WeightSpec, ...]] = []
    for s in specs:
        if s.full_name in paired:
            continue
        w3 = s.full_name[:-1] + "3"
        units.append((s, by_name[w3]) if w3 in paired and s.name.endswith(".w1") else (s,))
    return units


def _encode_unit(unit: tuple[WeightSpec, ...], c: DSV4Config, flavor: str, quant: str,
                 values: Values) -> dict[str, torch.Tensor]:
    import numpy as np

    if len(unit) == 1:
        return _stored(unit[0], c, flavor, quant, values(unit[0]))
    v1, v3 = values(unit[0]), values(unit[1])
    gs = _nvfp4_global(v1, flavor, max(float(np.abs(v1).max()), float(np.abs(v3).max())))
    out: dict[str, torch.Tensor] = {}
    for sp, v in zip(unit, (v1, v3)):
        out.update(_store_roles(sp, encode_nvfp4(v, gs), flavor))
    return out


def _check_request(c: DSV4Config, flavor: str, quant: str) -> list[WeightSpec]:
    if flavor not in FLAVORS:
        raise CheckpointError(f"synth flavor: expected one of {FLAVORS}, found {flavor!r}")
    if quant not in ("bf16", "fp8", "nvfp4"):
        raise CheckpointError(f"synth quant: expected bf16, fp8 or nvfp4, found {quant!r}")
    if quant != "bf16" and flavor != "hf":
        raise CheckpointError(f"synth: --quant applies to the hf flavor only, found flavor {flavor!r}")
    layout = get_layout(flavor)
    kind = "dspark" if c.dspark_block_size else "nextn"
    if layout.naming == "official" and kind not in layout.drafts:
        raise CheckpointError(f"synth flavor {flavor!r}: expected a config with a {' or '.join(layout.drafts)} "
                              f"draft, found a {kind} config (dspark_block_size={c.dspark_block_size})")
    # transformers' exports drop the draft; the official-named layouts carry it (compressed-tensors in BF16)
    with_mtp = layout.naming == "official" and (c.dspark_stages > 0 or c.num_nextn_predict_layers > 0)
    copies = [copy for copy, _ in layout.draft_copy_specs(c)] if with_mtp else []
    return list(all_weights(c, mtp=with_mtp)) + copies


def iter_tensors(c: DSV4Config, flavor: str, quant: str = "bf16", seed: int = 0, values: Values | None = None,
                 workers: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The stored tensors of ``c`` in layout ``flavor``, weight by weight, encoded by a thread pool
    (numpy and torch release the GIL in their kernels) a few weights ahead of the consumer, so a
    real-width checkpoint streams to disk without being held in memory. ``values`` as build_tensors."""
    from concurrent.futures import ThreadPoolExecutor

    units = _units(_check_request(c, flavor, quant), c, flavor, quant)
    own = values or (lambda spec: synthetic_values(spec, c, seed))
    copies = {copy.full_name: src for copy, src in get_layout(flavor).draft_copy_specs(c)}

    def values(spec: WeightSpec) -> np.ndarray:   # a draft's stored copy of a trunk weight: the trunk's values
        return own(copies.get(spec.full_name, spec))

    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        pending = []
        for unit in units:
            pending.append(pool.submit(_encode_unit, unit, c, flavor, quant, values))
            if len(pending) > 2 * workers:
                yield from pending.pop(0).result().items()
        for f in pending:
            yield from f.result().items()


def checkpoint_tensors(c: DSV4Config, flavor: str, quant: str = "bf16", seed: int = 0, values: Values | None = None
                       ) -> Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]]:
    """What write_checkpoint takes: the streamed tensors, or the whole dict where transformers' fused
    BF16 experts need whole layers."""
    if flavor == "hf" and quant == "bf16":
        return build_tensors(c, flavor, quant, seed, values)
    return iter_tensors(c, flavor, quant, seed, values)


def build_tensors(c: DSV4Config, flavor: str, quant: str = "bf16", seed: int = 0,
                  values: Values | None = None) -> dict[str, torch.Tensor]:
    """Every stored tensor of ``c`` in layout ``flavor``. ``values(spec)`` gives each weight's logical
    fp32 values (int64 for the hash table); by default the deterministic synthetic ones of ``seed``.
    A trained model or a converted checkpoint passes its own (the one encoder for every writer)."""
    tensors = dict(iter_tensors(c, flavor, quant, seed, values))
    if flavor == "hf" and quant == "bf16":
        _fuse_hf_experts(tensors, c)
    return tensors


def _fuse_hf_experts(tensors: dict[str, torch.Tensor], c: DSV4Config) -> None:
    """transformers stores BF16 experts fused: gate_up_proj [E, 2I, D] (w1 then w3), down_proj [E, D, I]."""
    import torch

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        gu, dn = [], []
        for e in range(c.n_routed_experts):
            g = tensors.pop(f"{p}{e}.gate_proj.weight")
            u = tensors.pop(f"{p}{e}.up_proj.weight")
            gu.append(torch.cat([g, u], 0))
            dn.append(tensors.pop(f"{p}{e}.down_proj.weight"))
        tensors[p + "gate_up_proj"] = torch.stack(gu)
        tensors[p + "down_proj"] = torch.stack(dn)


def write_checkpoint(out: Path, c: DSV4Config, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     flavor: str, shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer: Any = None) -> None:
    """Config, quantization files, shards (+ index when several) and the tokenizer.

    ``tensors``: a mapping (written in name order) or an iterable of (name, tensor) pairs written as
    they come, one shard at a time (iter_tensors). ``tokenizer``: a DSV4Tokenizer or
    tokenizers.Tokenizer; by default the filled tiny one of the config's vocabulary."""
    from safetensors.torch import save_file
    from .quant_configs import layout_quant_files

    out.mkdir(parents=True, exist_ok=True)
    cfg = config_dict(c, flavor)
    extra_files = layout_quant_files(get_layout(flavor), c)
    if "quantization_config" in extra_files:
        cfg["quantization_config"] = extra_files.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for fname, content in extra_files.items():
        (out / fname).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    items = sorted(tensors.items()) if isinstance(tensors, Mapping) else tensors
    meta = {"format": "pt"}   # one key only: safetensors writes metadata maps in random order
    mode = file_mode()   # safetensors creates its files 0600; outputs take the user's umask
    written: list[tuple[Path, list[str]]] = []
    shard: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        part = out / f".model-{len(written) + 1:05d}.partial"
        save_file(shard, str(part), metadata=meta)
        os.chmod(part, mode)
        written.append((part, sorted(shard)))
        shard.clear()

    for name, t in items:   # streamed: at most one shard is held in memory
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > shard_bytes:
            flush()
            size = 0
        shard[name] = t
        size += nbytes
        total += nbytes
    flush()
    if len(written) == 1:
        written[0][0].replace(out / "model.safetensors")
    else:
        wm = {}
        for i, (part, names) in enumerate(written):
            fname = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
            part.replace(out / fname)
            wm.update({n: fname for n in names})
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, indent=2) + "\n")
    _write_tokenizer(out, c, tokenizer)


def config_dict(c: DSV4Config, flavor: str) -> dict[str, Any]:
    """The config.json a checkpoint of ``c`` in layout ``flavor`` carries (the layout's config_form)."""
    form = get_layout(flavor).config_form
    if form == "hf":
        return c.to_hf_dict()
    d = c.to_transformers_dict()
    if form == "transformers-saved":   # the keys transformers' save_pretrained adds (config_keys.py)
        from ..config_keys import TRANSFORMERS_SAVED_EXTRAS

        d.update(TRANSFORMERS_SAVED_EXTRAS, dtype="bfloat16")
        d.pop("torch_dtype", None)
    return d


def _write_tokenizer(out: Path, c: DSV4Config, tokenizer: Any = None) -> None:
    from ..tokenizer import build_tiny_tokenizer, write_tokenizer

    write_tokenizer(tokenizer or build_tiny_tokenizer(vocab_size=c.vocab_size, fill=True), out)


def synth(preset: str = "tiny", flavor: str = "nvidia-nvfp4", out: str | Path = "tiny-ckpt", *, seed: int = 0,
          quant: str = "bf16", shard_bytes: int = DEFAULT_SHARD_BYTES, config: DSV4Config | None = None) -> Path:
    """Write a synthetic checkpoint and return its directory."""
    from ..config import REAL_PRESETS, preset as config_preset, with_dspark

    from .builtin import TRAINED

    if preset in TRAINED and config is None:
        raise CheckpointError(f"synth preset {preset!r}: a trained built-in is shipped, not synthesized; write it in "
                              f"another layout with `python -m dsv4.checkpoint.convert`")
    c = config or config_preset(preset)
    if c.name in REAL_PRESETS and config is None:
        raise CheckpointError(f"synth preset {preset!r}: expected a tiny preset (real sizes {REAL_PRESETS} are "
                              f"config-only; load a real checkpoint directory instead)")
    if flavor == "official-dspark" and not c.dspark_block_size:
        c = with_dspark(c)   # the 0731/0813 form of the preset: its DSpark keys and stages
    out = Path(out)
    write_checkpoint(out, c, checkpoint_tensors(c, flavor, quant, seed), flavor, shard_bytes)
    return out


def resolve_preset(preset: str, flavor: str = "nvidia-nvfp4", seed: int = 0) -> Path:
    """The cached checkpoint directory of a preset, generated on first use and written atomically
    (a temporary directory renamed into place), so parallel test workers are safe."""
    from .builtin import TRAINED, trained_path

    if preset in TRAINED:   # shipped trained weights, not synthesized
        return trained_path(preset, flavor, seed)
    final = cache_root() / f"{preset}-{flavor}-s{seed}-v{SYNTH_VERSION}"
    if (final / "config.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        synth(preset, flavor, tmp, seed=seed)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").exists():   # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsv4.checkpoint.synth", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--flavor", default="nvidia-nvfp4", choices=FLAVORS)
    p.add_argument("--quant", default="bf16", choices=("bf16", "fp8", "nvfp4"), help="hf flavor only")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES)
    a = p.parse_args(argv)
    try:
        out = synth(a.preset, a.flavor, a.out, seed=a.seed, quant=a.quant, shard_bytes=a.shard_bytes)
    except Exception as e:  # CLI edge: one clear line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    files = sorted(out.iterdir())
    total = sum(f.stat().st_size for f in files)
    print(f"wrote {out} ({a.preset}, {a.flavor}, seed {a.seed}): {len(files)} files, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
