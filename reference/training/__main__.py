"""python -m reference.training --out DIR: train the tiny DeepSeek-V4 on the recorded corpus.

Writes DIR/official (the checkpoint in the official FP8 + MXFP4 layout, its config and the trained
tokenizer), DIR/provenance.json, DIR/loss_curve.csv; DIR/train_state.pt lets a killed run resume.
The NVFP4 form is written by the project's converter:
``python -m dsv4.checkpoint.convert DIR/official --flavor nvidia-nvfp4 --out DIR/nvfp4``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference.training", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (created; an existing train_state.pt resumes)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--new-corpus", action="store_true",
                   help="record this interpreter's stdlib as the corpus (rewrites reference/training/corpus.json)")
    a = p.parse_args(argv)
    from .run import run_training

    return run_training(a)


if __name__ == "__main__":
    sys.exit(main())
