"""Names and defaults the CLIs need before any heavy import (argument parsing, ``--help``)."""

COLUMNS = ("logic", "floor", "bug_budget")          # the three columns, in report order
KL_DIRECTION = "KL(reference || test), nats, full vocabulary"
DEFAULT_TOPK = 5
DEFAULT_MUTUAL_TOPK = 5
DEFAULT_TOKENS = 300


def default_rules_path():
    """The shipped thresholds file (parity/thresholds/default.toml)."""
    from importlib import resources
    from pathlib import Path

    return Path(str(resources.files("parity").joinpath("thresholds").joinpath("default.toml")))
