"""Resolve ``--checkpoint DIR|PRESET`` once: path, config, fingerprint, tokenizer, router biases.

A tiny preset resolves to the cached synthetic checkpoint ``resolve_preset(name, "nvidia-nvfp4",
seed)``, a trained built-in (tiny-trained) to its shipped NVFP4 directory; real presets (flash, pro) have no weights and need a directory. Everything here reads only
headers and small tensors, so it is cheap enough to run before any model is loaded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from dsv4.checkpoint import CheckpointError, CheckpointReader, open_checkpoint
from dsv4.checkpoint.builtin import TRAINED
from dsv4.checkpoint.synth import resolve_preset
from dsv4.checkpoint.verify import verify_before_compute
from dsv4.config import PRESETS, REAL_PRESETS, DSV4Config
from dsv4.tokenizer import DSV4Tokenizer, TokenizerError, check_tokenizer_matches, load_tokenizer

from .errors import ParityInputError

SYNTH_FLAVOR = "nvidia-nvfp4"
_SYNTH_DIR = re.compile(r"^(?P<preset>.+)-(?P<flavor>official|nvidia-nvfp4|hf)-s(?P<seed>\d+)-v\d+$")


@dataclass
class CheckpointSource:
    spec: str                 # as given on the command line
    path: Path
    config: DSV4Config
    fingerprint: str
    seed: int | None          # synthetic seed, None for a real checkpoint
    tokenizer: DSV4Tokenizer
    reader: CheckpointReader

    @property
    def config_name(self) -> str:
        return self.config.name

    def router_bias(self, layer: int) -> torch.Tensor | None:
        """The selection-only bias of a score-routed layer (None on hash layers)."""
        if self.config.is_hash_layer(layer):
            return None
        return self.reader.weight("ffn.gate.bias", layer).tensors["weight"].to(torch.float64)


def resolve_checkpoint(spec: str | Path, seed: int = 0) -> CheckpointSource:
    s = str(spec)
    if s in PRESETS:
        if s in REAL_PRESETS:
            raise ParityInputError(f"checkpoint {s!r}: a real preset has no weights here; pass its checkpoint "
                                   f"directory (tiny presets: {sorted(set(PRESETS) - set(REAL_PRESETS))})")
        try:
            path = resolve_preset(s, SYNTH_FLAVOR, seed)
        except CheckpointError as e:   # a trained built-in with a seed, or not installed
            raise ParityInputError(str(e)) from None
        used_seed = None if s in TRAINED else seed   # a trained model has no synthetic seed
    else:
        path = Path(s)
        if not path.exists():
            raise ParityInputError(f"checkpoint: expected a directory, a .safetensors file or a preset "
                                   f"({sorted(PRESETS)}), found nothing at {s!r}")
        m = _SYNTH_DIR.match(path.name)
        used_seed = int(m.group("seed")) if m else None
    try:
        reader = open_checkpoint(path)
        verify_before_compute(reader)   # NaN weights, impossible scale codes: named before any FLOP
    except CheckpointError as e:
        raise ParityInputError(f"checkpoint {s}: {e}") from None
    tok_dir = path if path.is_dir() else path.parent
    try:
        tokenizer = load_tokenizer(tok_dir)
        check_tokenizer_matches(reader.config, tokenizer)
    except TokenizerError as e:
        raise ParityInputError(f"checkpoint {s}: {e}") from None
    return CheckpointSource(spec=s, path=path, config=reader.config, fingerprint=reader.fingerprint(),
                            seed=used_seed, tokenizer=tokenizer, reader=reader)
