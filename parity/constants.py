"""Names and defaults the CLIs need before any heavy import (argument parsing, ``--help``)."""

COLUMNS = ("logic", "floor", "bug_budget")          # the three columns, in report order
KL_DIRECTION = "KL(reference || test), nats, full vocabulary"
DEFAULT_TOPK = 5
DEFAULT_MUTUAL_TOPK = 5
DEFAULT_TOKENS = 300


def shipped_rules_file(name: str):
    """parity/thresholds/<name>.toml: ``default`` (the synthetic tiny checkpoints) or a trained built-in's."""
    from importlib import resources
    from pathlib import Path

    return Path(str(resources.files("parity").joinpath("thresholds"))) / f"{name}.toml"


def default_rules_path(checkpoint=None):
    """The shipped thresholds file of a checkpoint: a trained built-in's own (calibrated on it),
    otherwise default.toml (calibrated on the synthetic tiny checkpoints). ``checkpoint``: a
    --checkpoint value, a config name or None."""
    from dsv4.checkpoint.builtin import trained_name

    name = trained_name(checkpoint) if checkpoint is not None else None
    if name is not None and shipped_rules_file(name).is_file():
        return shipped_rules_file(name)
    return shipped_rules_file("default")
