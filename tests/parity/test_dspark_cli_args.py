"""python -m parity.dspark: an option given before the subcommand is not overwritten by the
subcommand's default (argparse copies a subparser's defaults over the parent's values)."""
from __future__ import annotations

import pytest

from parity.dspark.__main__ import CALIBRATION_SET, DEFAULT_CHECKPOINT, build_parser


@pytest.mark.parametrize("argv", [["--checkpoint", "tiny-dspark", "--threads", "1", "calibrate"],
                                  ["calibrate", "--checkpoint", "tiny-dspark", "--threads", "1"],
                                  ["--checkpoint", "tiny-dspark", "zoo", "--threads", "1"]])
def test_checkpoint_and_threads_stand_on_either_side_of_the_subcommand(argv: list[str]) -> None:
    a = build_parser().parse_args(argv)
    assert (a.checkpoint, a.threads) == ("tiny-dspark", 1)


def test_zoo_keeps_the_parents_prompt_options_and_defaults() -> None:
    a = build_parser().parse_args(["--tokens", "8", "--mode", "thinking", "zoo"])
    assert (a.tokens, a.mode, a.checkpoint) == (8, "thinking", DEFAULT_CHECKPOINT)
    a = build_parser().parse_args(["zoo", "--prompt", "chat-capital"])
    assert (a.tokens, a.mode, a.prompt) == (32, "chat", ["chat-capital"])


def test_calibrate_prompt_set_default_is_the_calibration_set() -> None:
    a = build_parser().parse_args(["calibrate"])
    assert a.prompt_set is None and CALIBRATION_SET == "prompts_calibration.toml"
    assert build_parser().parse_args(["calibrate", "--prompt-set", "x.toml"]).prompt_set == "x.toml"
