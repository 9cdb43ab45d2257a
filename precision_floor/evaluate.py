"""Score one precision plan through the parity harness, once per :class:`~precision_floor.cache.EvalKey`.

A *score* is read from the floor column's records (reference ``--profile`` <-> native plan on the
emulated backend), propagated mode:

* first-token KL(reference || native) mean +- SE over the prompts (``first_kl_mean`` / ``_se``);
* first-token top-1 agreement +- binomial SE (``first_top1_agree_rate`` / ``_se``);
* KL over every teacher-forced prompt position (more positions, so a smaller SE);
* the worst per-layer cosine: min over prompts and layers of ``layers.i.out`` (propagated: what the
  error has become by that layer's output), with the layer that holds it;
* selection agreement: mean router Jaccard over the score-routed layers (hash-routed layers agree by
  construction and would dilute it), mean indexer top-k overlap over the CSA layers.

Scores are pure functions of stored records (:func:`score_records`), so the report re-derives them
without running a model. The reference outputs are computed once per store (the parity reference
cache under the store) and shared by every plan.
"""
from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from dsv4.plan import PrecisionPlan
from parity.compare import CompareSettings
from parity.env import code_version
from parity.inputs import EncodedPrompt
from parity.logits_stats import top_tokens
from parity.records import ALL_PROMPTS
from parity.render import token_text
from parity.rules import load_rules
from parity.runner import DefaultLoaders, ModelLoaders
from parity.source import CheckpointSource
from parity.threeway import COLUMNS, EMULATED, RunSpec, run_threeway

from .cache import EvalContext, EvalKey, EvalStore, prompt_set_digest
from .errors import SearchError, StoreError
from .memory import plan_bytes

# The ten plan classes a flip can move between FP4 and BF16 (kv_cache holds activations: FP4 W4A4 has
# no meaning there, dsv4.plan.LEGAL_FORMATS), in the order of the flip tables.
from .constants import FLIP_CLASSES  # noqa: E402,F401  (re-exported)
SCORE_PAIR = "floor"
SCORE_MODE = "propagated"

# What an evaluation keeps of the harness's ~600 records per prompt (all of them are ~3 MB per plan
# on tiny; a 13-fault attribution study evaluates ~400 plans). A score evaluation keeps what the score
# needs and what a default rule judges on the logits aggregates: the first-token and all-position KL
# and top-1 aggregates, per-prompt first-token KL and top-1 (for paired differences), each layer
# output's cosine, the router / indexer agreement per layer. Column runs (the report's logic / floor /
# bug-budget curves, the attribution study's judged logic column) also keep the cosine of every probe,
# every selection summary and every record a default threshold rule judges, so judging them gives
# the verdict a full run would.
_SCORE_AGGREGATES = {"first_n_positions", "first_kl_mean", "first_kl_se", "first_top1_agree_rate",
                     "first_top1_agree_se", "n_positions", "kl_mean", "kl_se", "top1_agree_rate", "top1_agree_se"}
_LOGITS_PER_PROMPT = {"kl", "top1_agree"}
_SCORE_SELECTION = {"router_jaccard_mean", "hash_route_exact", "router_clear_flip_rate",
                    "indexer_topk_overlap_mean", "indexer_clear_flip_rate"}
_CURVE_SELECTION = _SCORE_SELECTION | {"router_jaccard_min", "router_flip_rate", "indexer_topk_overlap_min",
                                       "indexer_flip_rate", "entry_count_match"}
_LAYER_OUT = re.compile(r"layers\.\d+\.out")


@functools.lru_cache(maxsize=1)
def _rules() -> tuple[tuple[re.Pattern[str], str, str | None, str | None], ...]:
    from parity.constants import shipped_rules_file

    shipped = sorted(shipped_rules_file("default").parent.glob("*.toml"))   # every built-in model's thresholds
    return tuple((re.compile(r.probe), r.metric, r.pair, r.compare_mode) for f in shipped for r in load_rules(f).rules)


@functools.lru_cache(maxsize=65536)
def judged(probe: str, metric: str, pair: str, mode: str) -> bool:
    """Does some shipped rule judge this (probe, metric, pair, mode)? (profile and prompt filters are
    ignored: keeping a record a rule might skip costs bytes, dropping one it judges costs a verdict)."""
    return any(m == metric and p in (None, pair) and c in (None, mode) and rx.fullmatch(probe)
               for rx, m, p, c in _rules())


def keep_record(r: Mapping[str, Any], *, curves: bool) -> bool:
    probe, metric = r["probe"], r["metric"]
    if probe == "logits":
        if metric in (_SCORE_AGGREGATES if r["prompt_id"] == ALL_PROMPTS else _LOGITS_PER_PROMPT):
            return True
    elif metric in (_CURVE_SELECTION if curves else _SCORE_SELECTION):
        return True
    elif metric == "cosine" and (curves or _LAYER_OUT.fullmatch(probe)):
        return True
    return judged(probe, metric, r["pair"], r["compare_mode"]) and (curves or probe == "logits")


def plan_label(plan: PrecisionPlan) -> str:
    """A short display name: the nearest of all-fp4 / all-bf16 plus the classes that differ, e.g.
    ``all-fp4 + bf16{lm_head, indexer_q}`` (plan names list every override and get long)."""
    best = None
    for base in ("all-fp4", "all-bf16", "default"):
        ref = PrecisionPlan.preset(base)
        diff = [c for c, f in plan.components if ref[c] != f]
        if best is None or len(diff) < len(best[1]):
            best = (base, diff)
    base, diff = best  # type: ignore[misc]
    if not diff:
        return base
    by_fmt: dict[str, list[str]] = {}
    for c in diff:
        by_fmt.setdefault(plan[c], []).append(c)
    return base + "".join(f" + {f}{{{', '.join(cs)}}}" for f, cs in sorted(by_fmt.items()))


@dataclass(frozen=True)
class PlanScore:
    plan: PrecisionPlan
    digest: str
    kl: float
    kl_se: float
    top1: float
    top1_se: float
    kl_all: float
    kl_all_se: float
    worst_cos: float
    worst_cos_layer: int | None
    router_jaccard: float
    indexer_overlap: float
    n_prompts: int
    bytes: int
    seconds: float = 0.0
    cached: bool = False

    def row(self) -> dict[str, Any]:
        return {"plan": self.plan.name, "label": plan_label(self.plan), "plan_key": self.plan.key(),
                "kl": self.kl, "kl_se": self.kl_se, "top1": self.top1, "top1_se": self.top1_se,
                "kl_all": self.kl_all, "kl_all_se": self.kl_all_se,
                "worst_cos": self.worst_cos, "worst_cos_layer": self.worst_cos_layer,
                "router_jaccard": self.router_jaccard, "indexer_overlap": self.indexer_overlap,
                "n_prompts": self.n_prompts, "bytes": self.bytes, "digest": self.digest}


def score_records(df: pd.DataFrame, pair: str = SCORE_PAIR, mode: str = SCORE_MODE) -> dict[str, Any]:
    """The score metrics of one evaluation's records (see the module doc)."""
    d = df[(df["pair"] == pair) & (df["compare_mode"] == mode)]
    agg = d[(d["prompt_id"] == ALL_PROMPTS) & (d["probe"] == "logits")]
    vals = dict(zip(agg["metric"], agg["value"]))
    if "first_kl_mean" not in vals:
        raise SearchError(f"records of pair {pair!r} ({mode}) hold no first-token statistics "
                          f"(first_kl_mean): was the floor column run?")
    per = d[d["prompt_id"] != ALL_PROMPTS]
    outs = per[(per["metric"] == "cosine") & per["probe"].str.fullmatch(r"layers\.\d+\.out")]
    worst_row = outs.loc[outs["value"].idxmin()] if not outs.empty else None
    # Hash-routed layers (those with a hash_route_exact record) agree by construction: leave them out.
    h = per[per["metric"] == "hash_route_exact"]
    hashed = set(zip(h["probe"], h["prompt_id"]))
    jac = per[per["metric"] == "router_jaccard_mean"]
    jac = jac[[(p, q) not in hashed for p, q in zip(jac["probe"], jac["prompt_id"])]]
    idx = per[per["metric"] == "indexer_topk_overlap_mean"]
    return {
        "kl": vals["first_kl_mean"], "kl_se": vals.get("first_kl_se", math.nan),
        "top1": vals["first_top1_agree_rate"], "top1_se": vals.get("first_top1_agree_se", math.nan),
        "kl_all": vals.get("kl_mean", math.nan), "kl_all_se": vals.get("kl_se", math.nan),
        "worst_cos": float(worst_row["value"]) if worst_row is not None else math.nan,
        "worst_cos_layer": int(worst_row["layer"]) if worst_row is not None else None,
        "router_jaccard": float(jac["value"].mean()) if not jac.empty else math.nan,
        "indexer_overlap": float(idx["value"].mean()) if not idx.empty else math.nan,
        "n_prompts": int(vals.get("first_n_positions", 0)),
    }


@dataclass
class Evaluation:
    """One store entry: its key, manifest and (kept) records."""

    key: EvalKey
    manifest: dict[str, Any]
    records: pd.DataFrame
    cached: bool


# on_evaluated(plan, evaluation): called after every evaluation (computed or loaded), for progress.
EvalHook = Callable[[PrecisionPlan, Evaluation], None]
# Digests computed by this process, per store root: without --resume an evaluation is recomputed once
# per process, not once per study, so a report that runs flips then search computes a shared plan once.
_COMPUTED_IN_PROCESS: dict[str, set[str]] = {}


class Scorer:
    """Answers ``evaluate(plan)`` / ``score(plan)`` for one :class:`EvalContext` from a store; what
    to do when the store lacks an evaluation is the subclass's (:meth:`_compute`). Within a session an
    evaluation is read or computed once, and counted once: ``computed`` ran a model, ``loaded`` was
    read from the store."""

    def __init__(self, store: EvalStore, context: EvalContext, *, reuse: bool = True,
                 on_evaluated: EvalHook | None = None) -> None:
        self.store, self.context, self.reuse, self.on_evaluated = store, context, reuse, on_evaluated
        self.computed = 0
        self.loaded = 0
        self._session: dict[str, Evaluation] = {}
        self._scores: dict[str, PlanScore] = {}

    def key(self, plan: PrecisionPlan, columns: Sequence[str] = (SCORE_PAIR,), backend: str = EMULATED) -> EvalKey:
        return self.context.key(plan.key(), columns, backend)

    def evaluate(self, plan: PrecisionPlan, columns: Sequence[str] = (SCORE_PAIR,),
                 backend: str = EMULATED) -> Evaluation:
        key = self.key(plan, columns, backend)
        if key.digest() not in self._session:
            self.prefetch([plan], columns, backend)    # under torchrun: one rank computes it, the others read it
        return self._evaluate_here(plan, key, columns, backend)

    def prefetch(self, plans: Sequence[PrecisionPlan], columns: Sequence[str] = (SCORE_PAIR,),
                 backend: str = EMULATED) -> None:
        """Evaluations a study will certainly ask for next: under a multi-rank torchrun launch they are
        spread over the ranks (:mod:`precision_floor.distributed`; every rank must call this with the
        same plans); in one process nothing happens here (``evaluate`` computes on demand)."""
        from parity.distributed import current

        if current().active:
            from .distributed import prefetch

            prefetch(self, plans, columns, backend)

    def stored(self, key: EvalKey) -> bool:
        """Would ``evaluate`` read ``key`` from the store rather than compute it?"""
        here = _COMPUTED_IN_PROCESS.setdefault(str(Path(self.store.root).resolve()), set())
        return (self.reuse or key.digest() in here) and self.store.has(key)

    def mark_computed(self, digests: Sequence[str]) -> None:
        """Evaluations another rank of this launch computed: this process reads them, even without reuse."""
        _COMPUTED_IN_PROCESS.setdefault(str(Path(self.store.root).resolve()), set()).update(digests)

    def _evaluate_here(self, plan: PrecisionPlan, key: EvalKey, columns: Sequence[str], backend: str) -> Evaluation:
        digest = key.digest()
        if digest in self._session:
            return self._session[digest]
        here = _COMPUTED_IN_PROCESS.setdefault(str(Path(self.store.root).resolve()), set())
        if (self.reuse or digest in here) and self.store.has(key):
            stored = self.store.load(key)
            ev = Evaluation(key, stored.manifest, stored.records, True)
            self.loaded += 1
        else:
            ev = self._compute(plan, key, columns, backend)
            here.add(digest)
            self.computed += 1
        self._session[digest] = ev
        if self.on_evaluated:
            self.on_evaluated(plan, ev)
        return ev

    def _compute(self, plan: PrecisionPlan, key: EvalKey, columns: Sequence[str], backend: str) -> Evaluation:
        raise NotImplementedError

    def evaluations(self) -> list[Evaluation]:
        """Every evaluation this session read or computed."""
        return list(self._session.values())

    def score(self, plan: PrecisionPlan) -> PlanScore:
        """The floor-column score of ``plan``."""
        digest = self.key(plan).digest()
        if digest not in self._scores:
            ev = self.evaluate(plan)
            self._scores[digest] = PlanScore(plan=plan, digest=digest, bytes=int(ev.manifest["bytes"]),
                                             seconds=float(ev.manifest.get("seconds", 0.0)), cached=ev.cached,
                                             **score_records(ev.records))
        return self._scores[digest]


class Replay(Scorer):
    """Reads evaluations from a store and never runs a model: re-deriving a study (flip tables, the
    search's path) from records. A missing evaluation is a :class:`StoreError`."""

    def prefetch(self, plans: Sequence[PrecisionPlan], columns: Sequence[str] = (SCORE_PAIR,),
                 backend: str = EMULATED) -> None:
        """Nothing to spread: a replay only reads."""

    def _compute(self, plan: PrecisionPlan, key: EvalKey, columns: Sequence[str], backend: str) -> Evaluation:
        raise StoreError(f"store {self.store.root}: no evaluation of plan {plan.name!r} (columns {list(columns)}, "
                         f"backend {backend}, fault {self.context.fault}) for this context; run the study's "
                         f"CLI with --records {self.store.root} first")


class Evaluator(Scorer):
    """Evaluates plans on one checkpoint and prompt set through the parity harness, storing each.

    ``reuse=False`` (a CLI run without ``--resume``) recomputes each evaluation once in this process,
    overwriting what the store held. ``loaders`` replace the real model loaders (a fault study wraps
    them); ``manifest_extra(plan)`` adds keys to the manifest (e.g. whether a fault applied)."""

    def __init__(self, source: CheckpointSource, prompts: Sequence[EncodedPrompt], store: EvalStore, *,
                 profile: str = "bf16", modes: Sequence[str] = (SCORE_MODE,), loaders: ModelLoaders | None = None,
                 fault: str | None = None, device: str = "cpu", settings: CompareSettings | None = None,
                 topk: int = 5, reuse: bool = True, on_evaluated: EvalHook | None = None,
                 manifest_extra: Callable[[PrecisionPlan], dict[str, Any]] | None = None) -> None:
        from parity.distributed import broadcast

        # under torchrun every rank keys the store as rank 0 does (a commit landing between two ranks'
        # start would otherwise give them different code versions, so different store keys)
        context = broadcast(EvalContext(source.fingerprint, prompt_set_digest(prompts), profile, code_version(),
                                        tuple(modes), fault))
        super().__init__(store, context, reuse=reuse, on_evaluated=on_evaluated)
        self.source, self.prompts = source, list(prompts)
        self.loaders = loaders or DefaultLoaders()
        self.device, self.settings, self.topk = device, settings or CompareSettings(), topk
        self.manifest_extra = manifest_extra

    def with_fault(self, fault: str, loaders: ModelLoaders,
                   manifest_extra: Callable[[PrecisionPlan], dict[str, Any]] | None = None) -> "Evaluator":
        """The same session with a fault injected by ``loaders`` (another context: other store keys)."""
        return Evaluator(self.source, self.prompts, self.store, profile=self.context.profile, modes=self.context.modes,
                         loaders=loaders, fault=fault, device=self.device, settings=self.settings, topk=self.topk,
                         reuse=self.reuse, on_evaluated=self.on_evaluated, manifest_extra=manifest_extra)

    def _compute(self, plan: PrecisionPlan, key: EvalKey, columns: Sequence[str], backend: str) -> Evaluation:
        curves = tuple(columns) != (SCORE_PAIR,)
        spec = RunSpec(source=self.source, prompts=self.prompts, plan=plan, backend=backend,
                       profile=self.context.profile, device=self.device, settings=self.settings,
                       reference_cache=self.store.reference_dir, columns=tuple(columns), modes=self.context.modes,
                       fault=self.context.fault, run_id=key.run_id)
        t0 = time.perf_counter()
        result = run_threeway(spec, self.loaders).raise_errors()
        seconds = time.perf_counter() - t0
        kept = [r for r in result.records if keep_record(r, curves=curves)]
        manifest = {
            "plan": plan.to_dict(), "plan_name": plan.name, "config": self.source.config_name,
            "checkpoint": self.source.spec, "seed": self.source.seed, "fault": self.context.fault,
            "prompts": [{"id": p.id, "mode": p.mode, "tokens": p.n_tokens} for p in self.prompts],
            "bytes": plan_bytes(self.source.config, plan),
            "columns": {n: {"ran": c.ran, "reason": c.reason, "anchor": c.anchor, "test": c.test,
                            "load_seconds": c.load_seconds, "kernels_missing": c.kernels_missing,
                            "describe": _jsonable(c.test_describe)} for n, c in result.columns.items()},
            "seconds": seconds, "forward_seconds": sum(f.seconds for f in result.forwards),
            "reference_cache_hits": result.cache_hits,
            "topk": self._topk_tables(result) if curves else {},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **(self.manifest_extra(plan) if self.manifest_extra else {}),
        }
        self.store.put(key, kept, manifest)
        stored = self.store.load(key)
        return Evaluation(key, stored.manifest, stored.records, False)

    def _topk_tables(self, result: Any) -> dict[str, list[dict[str, Any]]]:
        """Per column and prompt: the anchor's first-token top-k with both sides' probabilities (the
        records hold per-position statistics, not token ids, so the report's top-k table lives here)."""
        tok = self.source.tokenizer
        out: dict[str, list[dict[str, Any]]] = {}
        for name, col in result.columns.items():
            rows = []
            for pid, (ref, test) in col.last_logits.items():
                for t in top_tokens(ref, test, self.topk):
                    rows.append({"prompt_id": pid, "rank": t.rank, "token_id": t.token_id,
                                 "token": token_text(tok, t.token_id), "ref_prob": t.ref_prob,
                                 "test_prob": t.test_prob, "ref_logit": t.ref_logit, "test_logit": t.test_logit,
                                 "test_rank": t.test_rank})
            out[name] = rows
        return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


__all__ = ["COLUMNS", "FLIP_CLASSES", "Evaluation", "Evaluator", "PlanScore", "Replay", "Scorer", "keep_record",
           "score_records"]
