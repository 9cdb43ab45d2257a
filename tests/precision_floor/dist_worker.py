"""One rank of a torchrun launch in tests/precision_floor/test_distributed.py (a script, not a test):
the flip tables of the tiny model on a few prompts, spread over the ranks by precision_floor.distributed.

    python -m torch.distributed.run --standalone --nproc-per-node N dist_worker.py STORE OUT [--resume]
        [--die-on-rank R --die-after K]

Each rank writes OUT.rank<r>.json: its computed / loaded counts and (rank 0) the flip tables.
``--die-on-rank R --die-after K``: rank R's process exits (os._exit, as a kill would) when it is
about to build its (K+1)-th native model, i.e. after K finished evaluations.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

CLASSES = ("lm_head", "router")
PROMPT_IDS = ("chat-capital", "thinking-train", "chat-chinese")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--die-on-rank", type=int, default=None)
    p.add_argument("--die-after", type=int, default=0)
    a = p.parse_args()

    import torch

    from dsv4.prompts import load_prompt_set
    from parity.distributed import init
    from parity.inputs import encode_prompts
    from parity.runner import DefaultLoaders
    from parity.source import resolve_checkpoint
    from precision_floor.cache import EvalStore
    from precision_floor.evaluate import Evaluator
    from precision_floor.flips import run_flips

    torch.set_num_threads(1)
    world, device = init("cpu")
    src = resolve_checkpoint("tiny", 0)
    prompts = encode_prompts([q for q in load_prompt_set() if q.id in PROMPT_IDS], src.tokenizer,
                             src.config.vocab_size)

    class Loaders(DefaultLoaders):
        builds = 0

        def native(self, path, **kw):
            if world.rank == a.die_on_rank and Loaders.builds >= a.die_after:
                sys.stdout.flush()
                os._exit(17)                      # no cleanup, no exception: a killed process
            Loaders.builds += 1
            return super().native(path, **kw)

    ev = Evaluator(src, prompts, EvalStore(a.store), loaders=Loaders(), reuse=a.resume, device=device)
    tables = run_flips(ev, CLASSES)
    out = {"rank": world.rank, "size": world.size, "computed": ev.computed, "loaded": ev.loaded,
           "native_builds": Loaders.builds}
    if world.main:
        out["tables"] = tables.to_json()
    with open(f"{a.out}.rank{world.rank}.json", "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
