"""A killed run resumes without recomputing finished evaluations; without --resume every plan is
computed again; the reference runs once per store."""
from __future__ import annotations

import pytest

from parity.runner import DefaultLoaders
from precision_floor.cache import EvalStore
from precision_floor import evaluate
from precision_floor.evaluate import Evaluator
from precision_floor.flips import run_flips

CLASSES = ("lm_head", "router")
TOTAL = 2 + 2 * len(CLASSES)   # two baselines + one plan per class and direction


class Killed(Exception):
    """Stands in for the process being killed."""


class CountingLoaders:
    """The real loaders, counting what they build; ``die_after`` native builds raise :class:`Killed`."""

    def __init__(self, die_after: int | None = None) -> None:
        self.base, self.die_after = DefaultLoaders(), die_after
        self.native_builds, self.reference_builds = 0, 0

    def reference(self, path, **kw):
        self.reference_builds += 1
        return self.base.reference(path, **kw)

    def native(self, path, **kw):
        if self.die_after is not None and self.native_builds >= self.die_after:
            raise Killed
        self.native_builds += 1
        return self.base.native(path, **kw)


@pytest.fixture
def two_prompts(prompts):
    return prompts[:2]


def test_interrupted_flips_resume_without_recomputing(tmp_path, tiny, two_prompts) -> None:
    store = EvalStore(tmp_path)
    first = CountingLoaders(die_after=3)
    with pytest.raises(Killed):
        run_flips(Evaluator(tiny, two_prompts, store, loaders=first), CLASSES)
    assert first.native_builds == 3 and len(store.manifests()) == 3

    second = CountingLoaders()
    ev = Evaluator(tiny, two_prompts, store, loaders=second, reuse=True)
    tables = run_flips(ev, CLASSES)
    assert (ev.loaded, ev.computed) == (3, TOTAL - 3)
    assert second.native_builds == TOTAL - 3
    assert second.reference_builds == 0            # the reference outputs came from the store's cache
    assert len(store.manifests()) == TOTAL and len(tables.rescue) == len(CLASSES)

    third = CountingLoaders()
    again = Evaluator(tiny, two_prompts, store, loaders=third, reuse=True)
    assert run_flips(again, CLASSES).rescue.equals(tables.rescue)
    assert (again.computed, third.native_builds) == (0, 0)


def test_without_resume_everything_is_recomputed_once(tmp_path, tiny, two_prompts) -> None:
    store = EvalStore(tmp_path)
    run_flips(Evaluator(tiny, two_prompts, store, loaders=CountingLoaders()), ("lm_head",))
    evaluate._COMPUTED_IN_PROCESS.clear()            # a second CLI run is another process
    loaders = CountingLoaders()
    ev = Evaluator(tiny, two_prompts, store, loaders=loaders, reuse=False)
    run_flips(ev, ("lm_head",))
    run_flips(ev, ("lm_head",))                      # the same session: served from memory
    assert ev.computed == loaders.native_builds == 4 and ev.loaded == 0
    assert len(store.manifests()) == 4               # overwritten in place, not duplicated


def test_without_resume_two_studies_of_one_process_compute_a_shared_plan_once(tmp_path, tiny, two_prompts) -> None:
    """The report runs flips then search in one process: the second study reads what the first computed
    (the store then holds nothing older than this process for those plans)."""
    store = EvalStore(tmp_path)
    evaluate._COMPUTED_IN_PROCESS.clear()
    first = CountingLoaders()
    run_flips(Evaluator(tiny, two_prompts, store, loaders=first, reuse=False), ("lm_head",))
    second = CountingLoaders()
    ev = Evaluator(tiny, two_prompts, store, loaders=second, reuse=False)
    run_flips(ev, ("lm_head",))
    assert (first.native_builds, second.native_builds, ev.loaded) == (4, 0, 4)
