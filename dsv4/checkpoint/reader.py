"""Lazy checkpoint reader: safetensors headers are parsed and validated at open, tensors are read
one at a time through ``safe_open`` only when asked for (spec §2; design principle 5)."""
from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..config import ConfigError, DSV4Config
from .errors import CheckpointError
from .fingerprint import shard_digests
from .flavors import (HF_FUSED_DOWN, HF_FUSED_GATE_UP, Location, base_candidates, hf_candidates,
                      official_candidates, tf_saved_base)
from .formats import HASH, NVFP4, RAW, StoredWeight, TensorInfo, WeightFormat, infer_format
from .layouts import FLAVORS, detect_layout
from .quant_configs import read_quant_config
from .names import LINEAR, NORM, TABLE, WeightSpec, all_weights, draft_weights

INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse one safetensors header and check that the file holds every byte it promises."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"shard {path.name}: expected a safetensors file (8-byte header length), "
                                      f"found {size} bytes")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"shard {path.name}: expected a header of {n} bytes inside the file, "
                                      f"found a file of {size} bytes (truncated or not safetensors)")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise CheckpointError(f"shard {path}: expected a file, found nothing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"shard {path.name}: expected a JSON safetensors header, found invalid data ({e})") \
            from None
    out: dict[str, TensorInfo] = {}
    data_len = size - 8 - n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, stop = meta["data_offsets"]
        if stop > data_len:
            raise CheckpointError(f"shard {path.name}: tensor '{name}' expected bytes {start}..{stop} of the data "
                                  f"section, found only {data_len} bytes (truncated shard)")
        out[name] = TensorInfo(name, meta["dtype"], tuple(meta["shape"]), path.name)
    return out


class CheckpointReader:
    """Open with :func:`open_checkpoint`. ``weight(name, layer)`` returns stored tensors of one
    canonical weight; ``get_tensor(name)`` one stored tensor; nothing is read before it is asked for."""

    def __init__(self, path: str | Path, config: DSV4Config | None = None) -> None:
        self.path = Path(path)
        self._files, self._index_file = self._resolve_files(self.path)
        self._infos: dict[str, TensorInfo] = {}
        for f in self._files:
            for name, info in read_header(f).items():
                if name in self._infos:
                    raise CheckpointError(f"tensor '{name}': expected in one shard, found in "
                                          f"{self._infos[name].shard} and {f.name}")
                self._infos[name] = info
        self._check_index()
        self._config_file = self._config_path(config)
        self.config = config if config is not None else self._load_config()
        self.quant_config = read_quant_config(self.path if self.path.is_dir() else self.path.parent,
                                              self._raw_config())
        self.layout, self.layout_reason = detect_layout(self._infos)
        self.flavor = self.layout.name
        self._handles: dict[str, Any] = {}
        self._weights: dict[str, tuple[WeightSpec, dict[str, Location], WeightFormat]] = {}
        self.has_mtp = False
        self._build()

    # ---- files --------------------------------------------------------------------------------
    @staticmethod
    def _resolve_files(path: Path) -> tuple[list[Path], Path | None]:
        if path.is_file():
            if path.suffix != ".safetensors":
                raise CheckpointError(f"checkpoint {path}: expected a .safetensors file or a directory, "
                                      f"found {path.suffix or 'a file without suffix'}")
            return [path], None
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path}: expected a directory or .safetensors file, found nothing")
        idx = path / INDEX_FILE
        if idx.exists():
            try:
                wm = json.loads(idx.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{idx}: expected JSON with a 'weight_map' object, found invalid content "
                                      f"({e})") from None
            shards = sorted(set(wm.values()))
            missing = [s for s in shards if not (path / s).exists()]
            if missing:
                raise CheckpointError(f"{INDEX_FILE}: names shard(s) {missing} which do not exist in {path}")
            return [path / s for s in shards], idx
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"checkpoint {path}: expected {INDEX_FILE} or *.safetensors files, found none")
        return files, None

    def _check_index(self) -> None:
        if self._index_file is None:
            return
        wm = json.loads(self._index_file.read_text())["weight_map"]
        for name, shard in wm.items():
            info = self._infos.get(name)
            if info is None or info.shard != shard:
                raise CheckpointError(f"{INDEX_FILE}: tensor '{name}' expected in shard {shard}, found "
                                      f"{info.shard if info else 'in no shard'}")
        extra = sorted(set(self._infos) - set(wm))
        if extra:
            raise CheckpointError(f"{INDEX_FILE}: tensors {extra[:5]} are in shards but not in the index")

    def _config_path(self, config: DSV4Config | None) -> Path | None:
        base = self.path if self.path.is_dir() else self.path.parent
        p = base / "config.json"
        if p.exists():
            return p
        if config is None:
            raise CheckpointError(f"checkpoint {self.path}: expected config.json beside the weights (or config=), "
                                  f"found none")
        return None

    def _raw_config(self) -> dict[str, Any] | None:
        if self._config_file is None:
            return None
        try:
            return json.loads(self._config_file.read_text())
        except json.JSONDecodeError:
            return None   # already reported by _load_config when it is the config in use

    def _load_config(self) -> DSV4Config:
        try:
            return DSV4Config.from_json(self._config_file)
        except ConfigError as e:
            raise CheckpointError(f"invalid config.json: {e}") from None

    # ---- the weight table -----------------------------------------------------------------------
    def _check_counts(self, names: set[str]) -> None:
        """Name the config/tensor disagreement (layer or expert count) before any per-tensor check."""
        c = self.config
        layers = {int(m.group(1)) for n in names if (m := re.match(r"^(?:model\.)?layers\.(\d+)\.", n))}
        experts = {int(m.group(1)) for n in names if (m := re.search(r"\.experts\.(\d+)\.", n))}
        fused = [self._infos[n] for n in names if n.endswith(HF_FUSED_GATE_UP)]
        if fused:
            experts |= set(range(fused[0].shape[0]))
        if layers and max(layers) + 1 != c.num_hidden_layers:
            raise CheckpointError(f"config disagrees with the tensors: config num_hidden_layers="
                                  f"{c.num_hidden_layers}, tensors hold layers 0..{max(layers)}")
        if experts and max(experts) + 1 != c.n_routed_experts:
            raise CheckpointError(f"config disagrees with the tensors: config n_routed_experts="
                                  f"{c.n_routed_experts}, tensors hold experts 0..{max(experts)}")

    def _build(self) -> None:
        c = self.config
        names = set(self._infos)
        self._check_counts(names)
        consumed: set[str] = set()
        prefix = ""
        hf_named = self.layout.naming == "hf"
        tf_saved = self.layout.naming == "tf-saved"
        if self.layout.naming == "official" and not any(n.startswith("layers.") for n in names) and \
                any(n.startswith("model.layers.") for n in names):
            prefix = "model."   # official names written by save_pretrained
        fused = hf_named and any(n.endswith(HF_FUSED_GATE_UP) for n in names)
        mtp_names = {n for n in names if re.match(r"^(model\.)?mtp\.", n)}
        self.has_mtp = bool(mtp_names)
        if self.has_mtp:
            self._check_draft_kind(mtp_names)
        specs = list(all_weights(c))
        if self.has_mtp:
            specs += draft_weights(c) + [copy for copy, _ in self.layout.draft_copy_specs(c)]
        missing: list[str] = []
        for spec in specs:
            if spec.mtp is not None:
                mp = "model." if any(n.startswith("model.mtp.") for n in mtp_names) else ""
                cands = official_candidates(spec, mp)
            elif hf_named:
                cands = hf_candidates(spec, fused, c.moe_intermediate_size, self.layout.roles)
            elif tf_saved:
                cands = base_candidates(spec, tf_saved_base(spec), self.layout.roles)
            else:
                cands = official_candidates(spec, prefix, self.layout.roles)
            w = cands["weight"]
            if w.name not in names and w.index is None and spec.kind == LINEAR:
                # an unquantized linear keeps '.weight' where the layout's quantized ones differ; an FP8-block
                # one adds its scale under the layout's fp8_roles (compressed-tensors: '.weight_scale')
                base = w.name[: -len(self.layout.roles["weight"])]
                if base + ".weight" in names:
                    cands = base_candidates(spec, base, self.layout.fp8_roles or {"weight": ".weight"})
            roles = {r: loc for r, loc in cands.items() if loc.name in names}
            if "weight" not in roles:
                missing.append(f"{cands['weight'].label()} {list(spec.shape)}")
                continue
            infos = {r: self._slice_info(spec, loc) for r, loc in roles.items()}
            fmt = infer_format(spec, infos)
            self._check_dtype(spec, fmt, infos["weight"])
            self._weights[spec.full_name] = (spec, roles, fmt)
            consumed.update(loc.name for loc in roles.values())
        if missing:
            more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
            raise CheckpointError(f"checkpoint {self.path} ({self.flavor}): missing tensors: {missing[:8]}{more}")
        unexpected = sorted(names - consumed)
        if unexpected:
            raise CheckpointError(self._explain_unexpected(unexpected))
        if hf_named and fused:
            self._check_fused()

    def _check_draft_kind(self, mtp_names: set[str]) -> None:
        """The config says which draft the mtp.* tensors are (dspark_block_size); they must agree."""
        c = self.config
        dspark_tensors = any(re.search(r"mtp\.\d+\.(main_proj|markov_head|confidence_head)\.", n) for n in mtp_names)
        kind = "dspark" if c.dspark_block_size else "nextn"
        if dspark_tensors and kind == "nextn":
            raise CheckpointError("config disagrees with the tensors: the tensors hold DSpark stages "
                                  "(mtp.0.main_proj, markov_head, ...) but the config has no dspark_* keys "
                                  "(expected dspark_block_size, dspark_target_layer_ids, ...; an older "
                                  "config.json beside 0731/0813 weights?)")
        if kind == "dspark" and not dspark_tensors:
            raise CheckpointError(f"config disagrees with the tensors: the config declares DSpark "
                                  f"(dspark_block_size={c.dspark_block_size}) but the mtp.* tensors are an April "
                                  f"NextN block (no mtp.0.main_proj)")
        if kind not in self.layout.drafts:
            raise CheckpointError(f"layout {self.layout.name}: mtp.* tensors: expected {self.layout.drafts}, "
                                  f"found a {kind} draft")

    def _check_dtype(self, spec: WeightSpec, fmt: WeightFormat, info: TensorInfo) -> None:
        """The release's own dtype per tensor kind (layouts.py): F32 where BF16 belongs is refused."""
        if fmt.kind == HASH:
            return
        kind = {NORM: "norm", TABLE: "table"}.get(spec.kind, "param" if fmt.kind == RAW else fmt.kind)
        want = self.layout.allowed_dtypes(kind)
        if want is not None and info.dtype not in want:
            raise CheckpointError(f"tensor '{info.name}' (weight {spec.full_name}): dtype: expected "
                                  f"{' or '.join(want)} in the {self.layout.name} layout, found {info.dtype}")

    def _slice_info(self, spec: WeightSpec, loc: Location) -> TensorInfo:
        info = self._infos[loc.name]
        if loc.index is None:
            return info
        c = self.config
        E, I, D = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size
        want = (E, 2 * I, D) if loc.name.endswith(HF_FUSED_GATE_UP) else (E, D, I)
        if info.shape != want:
            raise CheckpointError(f"tensor '{loc.name}': shape: expected {list(want)} (experts fused as "
                                  f"[E, 2I, D] / [E, D, I]), found {list(info.shape)}")
        return TensorInfo(loc.label(), info.dtype, spec.shape, info.shard)

    def _check_fused(self) -> None:
        for name, info in self._infos.items():
            if name.endswith((HF_FUSED_GATE_UP, HF_FUSED_DOWN)) and info.dtype not in ("BF16", "F16", "F32"):
                raise CheckpointError(f"tensor '{name}': dtype: expected BF16/F16/F32 for fused experts "
                                      f"(quantized experts are stored per expert), found {info.dtype}")

    def _explain_unexpected(self, unexpected: list[str]) -> str:
        c = self.config
        hints = []
        for n in unexpected[:8]:
            m = re.search(r"layers\.(\d+)\.", n)
            e = re.search(r"experts\.(\d+)\.", n)
            if m and int(m.group(1)) >= c.num_hidden_layers:
                hints.append(f"'{n}' (layer {m.group(1)}: config num_hidden_layers={c.num_hidden_layers})")
            elif e and int(e.group(1)) >= c.n_routed_experts:
                hints.append(f"'{n}' (expert {e.group(1)}: config n_routed_experts={c.n_routed_experts})")
            else:
                hints.append(f"'{n}'")
        more = f" (and {len(unexpected) - 8} more)" if len(unexpected) > 8 else ""
        return (f"checkpoint {self.path} ({self.flavor}): unexpected tensors, expected none beyond the "
                f"config's weight set, found {', '.join(hints)}{more}")

    # ---- public API ----------------------------------------------------------------------------
    def tensor_names(self) -> list[str]:
        return sorted(self._infos)

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise CheckpointError(f"tensor '{name}': expected a stored tensor name, found none") from None

    def get_tensor(self, name: str) -> torch.Tensor:
        info = self.tensor_info(name)
        return self._handle(info.shard).get_tensor(name)

    def _handle(self, shard: str) -> Any:
        h = self._handles.get(shard)
        if h is None:
            base = self.path if self.path.is_dir() else self.path.parent
            h = safe_open(str(base / shard), framework="pt", device="cpu")
            self._handles[shard] = h
        return h

    def _read(self, loc: Location) -> torch.Tensor:
        if loc.index is None:
            return self.get_tensor(loc.name)
        info = self._infos[loc.name]
        sl = self._handle(info.shard).get_slice(loc.name)
        e, a, b = loc.index
        return sl[e] if a is None else sl[e, a:b]

    def weight_names(self, layer: int | None = None) -> list[str]:
        """Canonical names of the weights of one layer (or the global ones when layer is None)."""
        return [s.name for s, _, _ in self._weights.values() if s.layer == layer and s.mtp is None]

    def weight_format(self, name: str, layer: int | None = None) -> WeightFormat:
        return self._entry(name, layer)[2]

    def weight(self, name: str, layer: int | None = None) -> StoredWeight:
        spec, roles, fmt = self._entry(name, layer)
        tensors = {r: self._read(loc) for r, loc in roles.items()}
        if fmt.kind == NVFP4:   # scalars stored as [1] or []: hand out 0-d tensors
            for r in ("weight_scale_2", "input_scale"):
                if r in tensors:
                    tensors[r] = tensors[r].reshape(())
                    if self.layout.global_scale == "reciprocal":
                        # compressed-tensors stores 2688/amax; hand out the dequantization multiplier,
                        # one FP32 reciprocal as vLLM takes it at load (nvfp4-and-kernels.md §3.4)
                        tensors[r] = (1.0 / tensors[r].to(torch.float32)).reshape(())
        return StoredWeight(tensors, fmt, {r: loc.label() for r, loc in roles.items()})

    def _entry(self, name: str, layer: int | None) -> tuple[WeightSpec, dict[str, Location], WeightFormat]:
        full = name if layer is None else f"layers.{layer}.{name}"
        try:
            return self._weights[full]
        except KeyError:
            where = "global" if layer is None else f"layer {layer}"
            raise CheckpointError(f"weight '{name}' ({where}): expected a canonical name such as 'attn.wq_a' "
                                  f"(layer) or 'embed' (global), found no such weight in {self.path}") from None

    def fingerprint(self) -> str:
        """sha256 over config.json, the index json, every shard's header bytes and size, and every
        shard's content digest (cached per file version, ``fingerprint.py``): a weight rewritten in
        place with the same shape changes it."""
        h = hashlib.sha256()
        if self._config_file is not None:
            h.update(self._config_file.read_bytes())
        else:
            h.update(json.dumps(self.config.to_hf_dict(), sort_keys=True).encode())
        if self._index_file is not None:
            h.update(self._index_file.read_bytes())
        for f in self._files:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                h.update(f.name.encode())
                h.update(fh.read(n))
            h.update(str(f.stat().st_size).encode())
        for name, digest in sorted(shard_digests(self._files).items()):
            h.update(f"{name}:{digest}".encode())
        return h.hexdigest()

    def close(self) -> None:
        self._handles.clear()

    def __repr__(self) -> str:
        return (f"CheckpointReader({str(self.path)!r}, flavor={self.flavor!r}, config={self.config.name!r}, "
                f"tensors={len(self._infos)}, shards={len(self._files)})")


def open_checkpoint(path: str | Path, config: DSV4Config | None = None) -> CheckpointReader:
    """Open a checkpoint lazily. ``path``: a directory (with ``model.safetensors.index.json`` or
    ``*.safetensors``, and ``config.json``) or a single ``.safetensors`` file; ``config`` overrides
    config.json. Raises :class:`CheckpointError` naming the tensor or key on any inconsistency."""
    return CheckpointReader(path, config)


__all__ = ["open_checkpoint", "CheckpointReader", "CheckpointError", "FLAVORS"]
