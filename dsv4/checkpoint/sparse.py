"""Full-size checkpoints without the weights: safetensors shards whose headers carry every real name,
shape, dtype and offset of a layout, and whose data regions are holes in a sparse file (a few KB on
disk). Every path that validates, plans memory and lazily opens tensors runs on them; a tensor read
returns zeros (F32 global / input scales read 1.0: a zero scale is not a valid value).

``python -m dsv4.checkpoint.sparse --preset flash-0731 --flavor official-dspark --out DIR``

The tensor set is the one the layout implies for the config (``layouts.py`` + ``names.py``, the
same naming the synthetic writer uses), or, with ``--headers FILE``, exactly the ``{shard: {name:
{dtype, shape}}}`` of a published index and headers.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Mapping

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import DSV4Config

from .formats import DENSE, FP8_BLOCK, MXFP4, NVFP4, stored_shapes

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "U8": 1, "I8": 1, "I32": 4, "I64": 8}
# the writer's format name -> (format kind of formats.py, stored dtype per role) as the releases store them
_FORMATS = {
    "fp8": (FP8_BLOCK, {"weight": "F8_E4M3", "scale": "F8_E8M0"}),
    "mxfp4": (MXFP4, {"weight": "I8", "scale": "F8_E8M0"}),
    "nvfp4": (NVFP4, {"weight": "U8", "weight_scale": "F8_E4M3", "weight_scale_2": "F32", "input_scale": "F32"}),
    "bf16": (DENSE, {"weight": "BF16"}),
}
DEFAULT_SHARD_BYTES = 5 * 10**9
# a zero global scale is an impossible value (the value scan refuses it; a reciprocal one divides by 0)
_SCALAR_SCALES = ("weight_scale_2", "input_scale", "weight_global_scale", "input_global_scale")


def expected_tensors(c: DSV4Config, flavor: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{stored name: (dtype, shape)}`` of a checkpoint of ``c`` in layout ``flavor``."""
    from .layouts import get_layout
    from .names import INDEX, LINEAR, NORM, PARAM, TABLE, all_weights

    from .synth import linear_format, role_names   # the writer's own naming (imports torch)

    layout = get_layout(flavor)
    with_mtp = layout.naming == "official" and (c.dspark_stages > 0 or c.num_nextn_predict_layers > 0)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    copies = [copy for copy, _ in layout.draft_copy_specs(c)] if with_mtp else []
    for spec in [*all_weights(c, mtp=with_mtp), *copies]:
        if spec.kind == LINEAR:
            fmt = linear_format(spec, c, flavor, "bf16")
            kind, dtypes = _FORMATS[fmt]
            if fmt == "fp8":
                dtypes = dict(dtypes, scale=layout.fp8_scale_dtype)
            names = role_names(spec, dtypes, flavor)
            for role, shape in stored_shapes(kind, spec.shape).items():
                out[names[role]] = (dtypes[role], tuple(shape))
            continue
        dtype = {NORM: "BF16", TABLE: "BF16", PARAM: "F32", INDEX: "I64"}[spec.kind]
        out[role_names(spec, ["weight"], flavor)["weight"]] = (dtype, tuple(spec.shape))
    return out


def write_sparse(out: Path, shards: Mapping[str, Mapping[str, tuple[str, tuple[int, ...]]]],
                 config: Mapping[str, object]) -> Path:
    """Write ``{shard file: {name: (dtype, shape)}}`` as sparse safetensors files, the index and config."""
    from .errors import CheckpointError

    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for fname, tensors in shards.items():
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        ones: list[int] = []   # offsets of F32 scalars (global / input scales): 1.0, not a hole's 0
        off = 0
        for name, (dtype, shape) in tensors.items():
            if dtype not in DTYPE_BYTES:
                raise CheckpointError(f"tensor '{name}': dtype: expected one of {sorted(DTYPE_BYTES)}, found {dtype!r}")
            n = DTYPE_BYTES[dtype]
            for d in shape:
                n *= d
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
            if dtype == "F32" and n == 4 and name.endswith(_SCALAR_SCALES):
                ones.append(off)
            off += n
            weight_map[name] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with (out / fname).open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(8 + len(raw) + off)   # the data region is a hole: no blocks on disk
            for o in ones:
                f.seek(8 + len(raw) + o)
                f.write(struct.pack("<f", 1.0))
        total += off
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def shard(tensors: Mapping[str, tuple[str, tuple[int, ...]]], shard_bytes: int) -> dict[str, dict]:
    groups: list[dict] = [{}]
    size = 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        if groups[-1] and size + n > shard_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = (dtype, shape)
        size += n
    k = len(groups)
    return {f"model-{i + 1:05d}-of-{k:05d}.safetensors": g for i, g in enumerate(groups)}


def sparse_checkpoint(config: DSV4Config, flavor: str, out: Path, shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    from ..config import with_dspark
    from .layouts import get_layout

    if get_layout(flavor).drafts == ("dspark",) and not config.dspark_block_size:
        config = with_dspark(config)
    from .synth import config_dict
    from .quant_configs import layout_quant_files

    cfg = config_dict(config, flavor)
    extra = layout_quant_files(get_layout(flavor), config)
    if "quantization_config" in extra:
        cfg["quantization_config"] = extra.pop("quantization_config")
    write_sparse(out, shard(expected_tensors(config, flavor), shard_bytes), cfg)
    for fname, content in extra.items():
        (out / fname).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    return out


def read_headers(path: str | Path) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """``{shard: {name: (dtype, shape)}}`` from a headers JSON (gzip'd when it ends in .gz)."""
    import gzip

    p = Path(path)
    raw = json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())
    return {f: {n: (m["dtype"], tuple(m["shape"])) for n, m in t.items() if n != "__metadata__"}
            for f, t in raw.items()}


def published_config(preset_or_path: str) -> dict | None:
    """The config.json given as a path (a file, or a directory holding one), as published; None for a preset."""
    p = Path(preset_or_path)
    p = p / "config.json" if p.is_dir() else p
    return json.loads(p.read_text()) if p.is_file() else None


def main(argv: list[str] | None = None) -> int:
    from ..config import load_config
    from .errors import CheckpointError
    from .layouts import FLAVORS

    p = argparse.ArgumentParser(prog="python -m dsv4.checkpoint.sparse", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="flash", help="a config preset (flash, pro, flash-0731, pro-0813, tiny) "
                   "or a config.json")
    p.add_argument("--flavor", default="official", choices=FLAVORS)
    p.add_argument("--headers", help="JSON (or .json.gz) {shard: {name: {dtype, shape}}} of a published checkpoint; "
                   "with a config.json as --preset, that file is copied verbatim")
    p.add_argument("--out", required=True)
    p.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES)
    a = p.parse_args(argv)
    try:
        config = load_config(a.preset)
        out = Path(a.out)
        if a.headers:
            write_sparse(out, read_headers(a.headers), published_config(a.preset) or config.to_hf_dict())
        else:
            sparse_checkpoint(config, a.flavor, out, a.shard_bytes)
    except (CheckpointError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    files = sorted(out.iterdir())
    print(f"wrote {out}: {len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB apparent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
