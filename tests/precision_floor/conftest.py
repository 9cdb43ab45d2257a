"""Fixtures of the precision-floor tests: the tiny checkpoint, a few prompts of the standard set,
and one study store (flip tables, floor search, column run, presets) shared by the report tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parity.inputs import encode_prompts
from parity.source import CheckpointSource, resolve_checkpoint

from dsv4.prompts import load_prompt_set

# A subset of the classes keeps the tiny studies at a few seconds: lm_head dominates the NVFP4 error
# on tiny (rescue ~0.12 -> ~0.02 nats), router and attn_kv barely move it.
CLASSES = ("lm_head", "router", "attn_kv")
PROMPT_IDS = ("chat-capital", "thinking-train", "chat-chinese")


@pytest.fixture(scope="session")
def tiny() -> CheckpointSource:
    torch.set_num_threads(1)   # tiny tensors: one thread is ~5x faster on the shared 2-core box
    return resolve_checkpoint("tiny", 0)


@pytest.fixture(scope="session")
def prompts(tiny: CheckpointSource):
    chosen = [p for p in load_prompt_set() if p.id in PROMPT_IDS]
    return encode_prompts(chosen, tiny.tokenizer, tiny.config.vocab_size)


@pytest.fixture(scope="session")
def study_dir(tmp_path_factory: pytest.TempPathFactory, tiny, prompts) -> Path:
    """A store holding what the report renders: flips, search, the floor's column run, presets."""
    from precision_floor.cache import EvalStore
    from precision_floor.evaluate import Evaluator
    from precision_floor.flips import run_flips
    from precision_floor.provenance import provenance
    from precision_floor.search import REFERENCE_PLANS, Budget, column_run, floor_search
    from dsv4.plan import PrecisionPlan

    root = tmp_path_factory.mktemp("study")
    store = EvalStore(root)
    ev = Evaluator(tiny, prompts, store)
    header = {"context": ev.context.to_dict(), "provenance": provenance(tiny, prompts, "cpu")}
    tables = run_flips(ev, CLASSES)
    store.write_json("flips", {**header, "classes": list(CLASSES), "directions": ["rescue", "damage"],
                               **tables.to_json()})
    lm = ev.score(PrecisionPlan.preset("all-fp4").replace(lm_head="bf16"))
    result = floor_search(ev, Budget(kl=lm.kl * 1.01, top1=0.0), CLASSES)
    column_run(ev, result.floor)
    for name in REFERENCE_PLANS:
        ev.score(PrecisionPlan.preset(name))
    store.write_json("search", {**header, "classes": list(CLASSES), **result.to_json()})
    return root
