"""Convert a checkpoint into another layout: ``python -m dsv4.checkpoint.convert SRC --flavor
nvidia-nvfp4 --out DST``.

Every weight is decoded exactly to FP32 by the native decoder (``dsv4.weights.dequantize``) and
re-encoded by the synthetic writer's encoders (one encoder for every writer), so the result is what
an NVFP4 export of the same weights is: FP8 blocks re-encode bit for bit (their values are on the
grid), MXFP4 experts become NVFP4 by the ModelOpt recipe (a requantization). Config, tokenizer and
the layout's quantization files are carried over; the source is validated before anything is written."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .layouts import FLAVORS


def convert(src: str | Path, flavor: str, out: str | Path, *, shard_bytes: int | None = None) -> Path:
    import torch

    from ..tokenizer import load_tokenizer
    from ..weights import dequantize
    from .formats import DENSE, HASH, RAW
    from .reader import open_checkpoint
    from .synth import DEFAULT_SHARD_BYTES, checkpoint_tensors, write_checkpoint

    reader = open_checkpoint(src)
    c = reader.config
    tok = load_tokenizer(src)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"convert --out: expected a new or empty directory, found {out} with files in it")

    def values(spec):
        sw = reader.weight(spec.full_name)
        if sw.fmt.kind == HASH:
            return sw.tensors["weight"].to(torch.int64).numpy()
        if sw.fmt.kind in (DENSE, RAW):
            return sw.tensors["weight"].to(torch.float32).numpy()
        return dequantize(sw).numpy()

    write_checkpoint(out, c, checkpoint_tensors(c, flavor, values=values), flavor, shard_bytes or DEFAULT_SHARD_BYTES,
                     tokenizer=tok)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsv4.checkpoint.convert", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="checkpoint directory")
    p.add_argument("--flavor", required=True, choices=FLAVORS, help="target layout")
    p.add_argument("--out", required=True, help="new directory")
    p.add_argument("--shard-bytes", type=int, default=None)
    a = p.parse_args(argv)
    try:
        out = convert(a.src, a.flavor, a.out, shard_bytes=a.shard_bytes)
    except (ValueError, OSError) as e:   # CheckpointError, TokenizerError, ConfigError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({a.flavor}): {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
