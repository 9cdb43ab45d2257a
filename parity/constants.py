"""Names and defaults the CLIs need before any heavy import (argument parsing, ``--help``)."""

COLUMNS = ("logic", "floor", "bug_budget")          # the three columns, in report order
KL_DIRECTION = "KL(reference || test), nats, full vocabulary"
DEFAULT_TOPK = 5
DEFAULT_MUTUAL_TOPK = 5
DEFAULT_TOKENS = 300


def default_rules_path(checkpoint=None):
    """The shipped thresholds file of a checkpoint: a trained built-in's own (calibrated on it,
    parity/thresholds/<name>.toml), otherwise parity/thresholds/default.toml (calibrated on the
    synthetic tiny checkpoints). ``checkpoint``: a --checkpoint value, a config name or None."""
    from importlib import resources
    from pathlib import Path

    from dsv4.checkpoint.builtin import trained_name

    folder = Path(str(resources.files("parity").joinpath("thresholds")))
    name = trained_name(checkpoint) if checkpoint is not None else None
    if name is not None and (folder / f"{name}.toml").is_file():
        return folder / f"{name}.toml"
    return folder / "default.toml"
