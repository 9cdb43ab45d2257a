"""``python -m reference.training.draft --out DIR``: the trained tiny target in its 0731 form
(three DSpark stages after its four layers, ``with_dspark``), the draft trained against it, the
checkpoint written in the official 0731 layout with the target's weights unchanged, and the real
greedy acceptance length measured by the reference's speculative loop on the standard prompts."""
from __future__ import annotations

import argparse

from .draft_settings import DraftSettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference.training.draft", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (created; an existing train_state.pt resumes)")
    p.add_argument("--steps", type=int, default=DraftSettings.steps)
    p.add_argument("--seq-len", type=int, default=DraftSettings.seq_len)
    p.add_argument("--anchors", type=int, default=DraftSettings.anchors, help="draft calls trained per window")
    p.add_argument("--lr", type=float, default=DraftSettings.lr)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    from .draft_run import run_draft_training

    return run_draft_training(a)


if __name__ == "__main__":
    import sys

    sys.exit(main())
