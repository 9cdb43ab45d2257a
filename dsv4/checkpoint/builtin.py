"""Built-in trained checkpoints shipped in the repository (``dsv4/data/models/``).

Unlike the synthetic presets these have one set of weights (no seeds), trained by
``python -m reference.training`` (provenance.json beside them). Each is shipped once: the target in
the official FP8 + MXFP4 layout, the DSpark draft as its ``mtp.*`` tensors alone; the 0731 checkpoint
and the NVFP4 forms are derived on first use into the cache, byte for byte what used to be shipped
(``builtin_derive``). Other layouts are one convert call away. The reference resolves these names too."""
from __future__ import annotations

from pathlib import Path

from .builtin_derive import MODELS_DIR, derived_dir, recipes, source_dir
from .errors import CheckpointError

# name -> {layout: directory name}, shipped under MODELS_DIR or derived (builtin_derive); the directory
# name is the config's name (the NVFP4 form, which the native model runs, carries the model's own name)
TRAINED: dict[str, dict[str, str]] = {
    "tiny-trained": {"nvidia-nvfp4": "tiny-trained", "official": "tiny-trained-official"},
    # its 0731 form: the same target weights with a DSpark draft trained against it
    # (python -m reference.training.draft; docs/trained-model.md)
    "tiny-trained-dspark": {"nvidia-nvfp4": "tiny-trained-dspark", "official-dspark": "tiny-trained-dspark-official"},
}
DEFAULT_CHECKPOINT = "tiny-trained"   # what every CLI runs when --checkpoint is not given


def trained_name(checkpoint: str | Path) -> str | None:
    """The trained built-in a --checkpoint value, shipped directory or config name denotes, or None."""
    s = str(checkpoint)
    if s in TRAINED:
        return s
    for name, dirs in TRAINED.items():
        if s in dirs.values():   # a config name (the directory name)
            return name
        try:
            if any(Path(s).resolve() == _location(d).resolve() for d in dirs.values()):
                return name
        except OSError:
            pass
    return None


def _location(d: str) -> Path:
    """Where a layout directory is (derived ones: where they are or will be built; nothing is built)."""
    return derived_dir(d) if d in recipes() else MODELS_DIR / d


def provenance_path(name: str) -> Path:
    return MODELS_DIR / f"{name}.provenance.json"


def official_path(name: str) -> Path:
    """The directory of a trained built-in in the layout training wrote (official, or official-dspark)."""
    return source_dir(next(d for layout, d in TRAINED[name].items() if layout.startswith("official")))


def trained_path(name: str, flavor: str = "nvidia-nvfp4", seed: int = 0) -> Path:
    """The directory of a trained built-in in one layout (a derived layout is built on first use)."""
    if name not in TRAINED:
        raise CheckpointError(f"built-in checkpoint: expected one of {sorted(TRAINED)}, found {name!r}")
    if seed != 0:
        raise CheckpointError(f"checkpoint {name!r}: a trained model has one set of weights, so no seed "
                              f"{seed} (seeds select the synthetic presets' weights)")
    if flavor not in TRAINED[name]:
        raise CheckpointError(f"checkpoint {name!r}: shipped as {', '.join(TRAINED[name])}, not {flavor!r}; write "
                              f"that layout with `python -m dsv4.checkpoint.convert {official_path(name)} "
                              f"--flavor {flavor} --out DIR`")
    path = source_dir(TRAINED[name][flavor])
    if not (path / "config.json").is_file():
        raise CheckpointError(f"checkpoint {name!r}: expected its files at {path}, found none (an incomplete "
                              f"clone or install?)")
    return path


def add_checkpoint_argument(parser) -> None:
    """The one ``--checkpoint`` option of every CLI (default: the trained tiny model)."""
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT,
                        help=f"checkpoint directory, {DEFAULT_CHECKPOINT} (the trained tiny model, default) or a "
                             f"synthetic preset such as tiny (random weights; --seed picks them)")
