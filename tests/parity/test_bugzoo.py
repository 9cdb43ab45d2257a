"""The bug zoo: registry semantics (register, list, exact patch/restore, user modules, errors), and
end to end on tiny seed 0 with the hold-out prompts (``-m parity``): every built-in fault is caught
in its column and localized, the clean row raises no alarm, the kernel fault is caught through the
faulty backend."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from rich.console import Console

import dsv4
import reference
from dsv4.layers import attention, compressor, indexer, linear, moe, router, shared_expert
from parity.bugzoo import (FaultError, FaultTargetError, get_fault, list_faults, load_faults_module, patched,
                           register_fault, unregister_fault)
from parity.bugzoo.__main__ import main as zoo_main
from parity.bugzoo.backends import CLEAN_COPY
from parity.bugzoo.faults import UNCLAMPED_SIGMOID_BACKEND
from parity.bugzoo.runner import ZooSpec, held_out, load_holdout, run_one, run_zoo
from parity.inputs import encode_prompts, select_prompts
from parity.records import read_records, write_records
from parity.rules import load_rules

BUILTIN_MODULES = ("parity.bugzoo.faults", "parity.bugzoo.kernel_faults", "parity.bugzoo.logic_faults")
BUILTIN = [f.name for f in list_faults() if f.module in BUILTIN_MODULES]
PLAN_OF_COLUMN = {"logic": "all-fp32", "floor": "default", "bug_budget": "default"}
LAYER_CLASSES = (attention.Attention, compressor.Compressor, indexer.Indexer, linear.Bf16Linear, linear.Fp4Linear,
                 linear.Fp8Linear, moe.MoE, router.Router, router.HashRouter, shared_expert.SharedExpert)


pytestmark = pytest.mark.slow   # slow: the whole zoo runs once per built-in model (~75 s each)


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


# ---- registry semantics --------------------------------------------------------------------------
@pytest.fixture
def scratch_fault() -> Iterator[str]:
    """A throw-away fault name, unregistered afterwards whatever the test did."""
    name = "test_scratch_fault"
    yield name
    try:
        unregister_fault(name)
    except FaultError:
        pass


def test_register_list_get_and_unregister(scratch_fault: str) -> None:
    @register_fault(scratch_fault, layer=2, component="router", column="logic", description="  a test fault ")
    def f(model: Any) -> Iterator[None]:
        yield

    assert get_fault(scratch_fault) is f
    assert [x.name for x in list_faults()][-1] == scratch_fault   # user faults after the built-ins
    assert f.expectation() == {"column": "logic", "layer": 2, "component": "router", "localization": ["router"],
                               "modes": ["isolated"], "backend": None, "checkpoint": False}
    assert f.description == "a test fault" and f.module == __name__
    assert f.localizes(2, "router") and not f.localizes(3, "router") and not f.localizes(2, "moe")
    unregister_fault(scratch_fault)
    with pytest.raises(FaultError, match="unknown fault"):
        get_fault(scratch_fault)


def test_a_name_is_registered_once_unless_replaced(scratch_fault: str) -> None:
    register_fault(scratch_fault, layer=0, component="router", column="logic", description="x")(lambda m: iter([None]))

    def other(model: Any) -> Iterator[None]:
        yield

    with pytest.raises(FaultError, match="already registered"):
        register_fault(scratch_fault, layer=0, component="router", column="logic", description="y")(other)
    g = register_fault(scratch_fault, layer=1, component="moe", column="logic", description="y", replace=True)(other)
    assert get_fault(scratch_fault) is g and g.layer == 1


@pytest.mark.parametrize("kw, fragment", [
    ({"column": "kernel"}, "column: expected one of"),
    ({"component": "attn"}, "component class"),
    ({"localization": ("router", "mlp")}, "component class"),
    ({"layer": -1}, "layer: expected"),
    ({"layer": True}, "layer: expected"),
    ({"modes": ("propagated",)}, "must include 'isolated'"),
    ({"modes": ("sideways", "isolated")}, "modes: expected"),
    ({"backend": UNCLAMPED_SIGMOID_BACKEND}, "bug_budget column"),
])
def test_bad_registrations_are_rejected(kw: dict, fragment: str) -> None:
    args = {"layer": 0, "component": "router", "column": "logic", "description": "x", **kw}
    with pytest.raises(FaultError, match=fragment):
        register_fault("test_never_registered", **args)
    with pytest.raises(FaultError):
        get_fault("test_never_registered")


def test_unknown_fault_names_the_known_ones() -> None:
    with pytest.raises(FaultError, match="attention_sink_dropped"):
        get_fault("no_such_fault")
    con, buf = _console()
    assert zoo_main(["--fault", "no_such_fault"], console=con) == 2
    assert "unknown fault" in buf.getvalue()


def test_user_module_registers_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = ('from parity.bugzoo import register_fault\n'
           '@register_fault("{name}", layer=None, component="lm_head", column="floor", description="user")\n'
           'def f(model):\n    yield\n')
    (tmp_path / "my_zoo_faults.py").write_text(src.format(name="test_user_dotted"))
    (tmp_path / "by_path.py").write_text(src.format(name="test_user_path"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert [f.name for f in load_faults_module("my_zoo_faults")] == ["test_user_dotted"]
        assert [f.name for f in load_faults_module(str(tmp_path / "by_path.py"))] == ["test_user_path"]
        con, buf = _console()
        assert zoo_main(["--faults-module", "my_zoo_faults", "--list"], console=con) == 0
        out = buf.getvalue()
        assert "test_user_dotted" in out and "attention_sink_dropped" in out
    finally:
        for n in ("test_user_dotted", "test_user_path"):
            unregister_fault(n)
    con, buf = _console()
    assert zoo_main(["--faults-module", "no_such_module_xyz"], console=con) == 2
    assert "cannot import" in buf.getvalue()


class _Thing:
    def __init__(self) -> None:
        self.value = 1

    def method(self) -> str:
        return "stock"


def test_patched_shadows_one_instance_and_restores_its_dict() -> None:
    a, b = _Thing(), _Thing()
    before = dict(vars(a))
    with patched(a, "method", lambda: "bug"), patched(a, "value", 2):
        assert a.method() == "bug" and a.value == 2
        assert b.method() == "stock" and _Thing.method(a) == "stock"    # class and other instances intact
    assert vars(a) == before and a.method() == "stock"
    with pytest.raises(RuntimeError):
        with patched(a, "method", lambda: "bug"):
            raise RuntimeError("inside")
    assert "method" not in vars(a)       # restored on an exception too
    with pytest.raises(FaultTargetError, match="no such attribute"):
        with patched(a, "nope", 1):
            pass


# ---- every built-in fault on a real model: bites inside, restores exactly ------------------------
def state_digest(root: Any) -> list[tuple[str, str]]:
    """Every reachable attribute of a model as (path, type + value or tensor hash): two models with
    equal digests hold bit-identical tensors, equal scalars and the same instance attributes (a
    leftover patch is an extra ``__dict__`` key)."""
    out: list[tuple[str, str]] = []
    seen: set[int] = set()

    def walk(x: Any, path: str) -> None:
        if isinstance(x, torch.Tensor):
            raw = x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            out.append((path, f"{x.dtype}{tuple(x.shape)}:{hashlib.sha256(raw).hexdigest()}"))
        elif x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device)):
            out.append((path, repr(x)))
        elif id(x) in seen:
            out.append((path, f"<shared {type(x).__name__}>"))
        elif callable(x) and not hasattr(x, "__dict__") or isinstance(x, type(state_digest)):
            out.append((path, f"callable {getattr(x, '__qualname__', type(x).__name__)}"))
        else:
            seen.add(id(x))
            if isinstance(x, dict):
                for k in sorted(x, key=repr):
                    walk(x[k], f"{path}[{k!r}]")
            elif isinstance(x, (list, tuple)):
                for i, v in enumerate(x):
                    walk(v, f"{path}[{i}]")
            else:
                out.append((path, type(x).__qualname__))
                for k in sorted(vars(x)) if hasattr(x, "__dict__") else ():
                    walk(vars(x)[k], f"{path}.{k}")

    walk(root, "model")
    return out


@pytest.fixture(scope="module")
def probe_ids() -> torch.Tensor:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    return torch.randint(2, 500, (72,), generator=g)   # 72 tokens: every compressed layer forms entries


@pytest.mark.parametrize("name", BUILTIN)
def test_fault_bites_inside_and_restores_the_model_bit_for_bit(name: str, probe_ids: torch.Tensor) -> None:
    fault = get_fault(name)
    plan = PLAN_OF_COLUMN[fault.column]
    classes = {c: dict(vars(c)) for c in LAYER_CLASSES}
    fresh, victim = dsv4.load_model("tiny", plan=plan), dsv4.load_model("tiny", plan=plan)
    with torch.no_grad():
        clean = fresh(probe_ids)
        with fault(victim):
            faulty = victim(probe_ids)
        after = victim(probe_ids)
    assert not torch.equal(faulty, clean), f"{name} changed nothing on a {plan} model"
    assert torch.equal(after, clean)
    for m in (fresh, victim):   # call counters are history, not state: compare them separately
        m.reset_kernel_log()
    assert state_digest(victim) == state_digest(fresh)
    assert {c: dict(vars(c)) for c in LAYER_CLASSES} == classes   # no class was patched


def test_faults_refuse_the_reference() -> None:
    ref = reference.load_model("tiny")
    for name in ("attention_sink_dropped", "lm_head_fp4"):
        with pytest.raises(FaultTargetError, match="never patch the reference"):
            get_fault(name)(ref)


def test_precision_fault_on_a_class_already_fp4_is_a_clear_error() -> None:
    model = dsv4.load_model("tiny", plan={"base": "default", "components": {"lm_head": "fp4"}})
    with pytest.raises(FaultTargetError, match="already fp4"):
        with get_fault("lm_head_fp4")(model):
            pass


# ---- end to end (the zoo on both built-in models: the trained default and synthetic tiny seed 0;
# hold-out prompts, each model judged by its own thresholds) ------------------------------------------
@pytest.fixture(scope="module", params=["tiny-trained", "tiny"])
def zoo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.set_num_threads(1)
    from parity.source import resolve_checkpoint

    src = resolve_checkpoint(request.param, 0)
    spec = ZooSpec(source=src, prompts=load_holdout(src), rules=load_rules(None, request.param), prompt_set="holdout",
                   reference_cache=tmp_path_factory.mktemp("refcache"))
    return run_zoo(spec, [get_fault(n) for n in BUILTIN])


@pytest.mark.parity
@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_fault_is_caught_in_its_column_and_localized(zoo: Any, name: str) -> None:
    row = next(r for r in zoo.rows if r.name == name)
    fault = row.fault
    assert row.error is None
    assert row.caught and row.columns_alarmed == [fault.column], row.to_dict()
    cb = row.caught_by
    assert cb["pair"] == fault.column and (cb["ratio"] is None or cb["ratio"] > 1)
    if fault.column == "logic" and cb["ratio"] is not None:
        assert cb["ratio"] >= 100, cb     # the FP32 logic column: a logic bug stands far above FP32 noise
    d = row.first_divergence
    assert d["layer"] == fault.layer and d["component"] in fault.localization
    assert row.localized and row.passed


@pytest.mark.parity
def test_clean_row_raises_no_alarm(zoo: Any) -> None:
    clean = zoo.rows[0]
    assert clean.fault is None and clean.passed, clean.to_dict()
    assert clean.columns_run == ["logic", "floor", "bug_budget"] and clean.columns_alarmed == []
    assert clean.modes == ["propagated", "isolated"]
    assert zoo.passed


@pytest.mark.parity
def test_bug_budget_fault_is_caught_through_the_faulty_backend(zoo: Any, tmp_path: Path) -> None:
    path = tmp_path / "zoo.jsonl"
    write_records(path, zoo.records)
    df = read_records(path)
    row = next(r for r in zoo.rows if r.name == "fused_swiglu_unclamped_sigmoid")
    assert row.backend == UNCLAMPED_SIGMOID_BACKEND.name and row.columns_run == ["floor", "bug_budget"]
    mine = df[df["fault"] == row.name]
    assert set(mine[mine["pair"] == "bug_budget"]["backend"]) == {UNCLAMPED_SIGMOID_BACKEND.name}
    assert set(mine[mine["pair"] == "floor"]["backend"]) == {"emulated"}   # the emulation side stayed clean
    assert row.columns_alarmed == ["bug_budget"] and not row.kernels_missing
    # the control: the same copied GEMM code with the correct epilogue raises nothing
    clean = df[df["fault"].isna() & (df["pair"] == "bug_budget")]
    assert set(clean["backend"]) == {CLEAN_COPY} and not zoo.rows[0].columns_alarmed
    # ... and nothing registered for the run leaks into later CPU runs' 'auto' choice
    from parity.threeway import resolve_kernel_backend

    assert resolve_kernel_backend("auto", "cpu")[0] is None


@pytest.mark.parity
def test_records_and_summary(zoo: Any) -> None:
    assert {r["fault"] for r in zoo.records} == {None, *BUILTIN}
    s = zoo.summary()
    json.dumps(s, allow_nan=False)   # strict JSON: the HTML report reads it
    assert s["schema"] == "parity.bugzoo/1" and s["passed"] is True
    trained = zoo.spec.source.seed is None   # a trained model: calibrated on its own prompt set, no seeds
    assert s["held_out"] == {"seed": True, "prompts": True, "calibration_seeds": [] if trained else [1, 2, 3],
                             "shared_prompt_ids": []}
    assert [r["fault"] for r in s["rows"]] == [None, *BUILTIN]
    assert s["checkpoint"]["seed"] == (None if trained else 0) and len(s["prompts"]) >= 6


@pytest.mark.parity
def test_an_undetected_or_misplaced_fault_fails_its_row(zoo: Any, scratch_fault: str) -> None:
    spec = zoo.spec

    @register_fault(scratch_fault, layer=0, component="router", column="logic", description="does nothing")
    def harmless(model: Any) -> Iterator[None]:
        yield

    row, _ = run_one(spec, harmless)
    assert not row.caught and not row.passed and row.first_divergence is None

    # a real bug whose registration points at the wrong layer is caught but not localized
    sink = get_fault("attention_sink_dropped")
    wrong = register_fault(scratch_fault, layer=3, component="attention", column="logic", description="misplaced",
                           replace=True)(sink.inject.__wrapped__)
    row, _ = run_one(spec, wrong)
    assert row.caught and row.localized is False and not row.passed


def test_held_out_flags_calibration_inputs() -> None:
    from parity.source import resolve_checkpoint

    src = resolve_checkpoint("tiny", 1)
    std = encode_prompts(select_prompts("chat")[:2], src.tokenizer, src.config.vocab_size)
    h = held_out(ZooSpec(source=src, prompts=std, rules=load_rules()))
    assert h["seed"] is False and h["prompts"] is False and h["shared_prompt_ids"] == sorted(p.id for p in std)


@pytest.mark.parity
def test_cli_end_to_end(tmp_path: Path) -> None:
    recs, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    con, buf = _console()
    rc = zoo_main(["--fault", "hash_routing_ignored", "--records", str(recs), "--json", str(summary)], console=con)
    out = buf.getvalue()
    assert rc == 0, out
    assert "hash_routing_ignored" in out and "hash_route_exact" in out and "PASS" in out
    s = json.loads(summary.read_text())
    assert [r["fault"] for r in s["rows"]] == [None, "hash_routing_ignored"]
    assert set(read_records(recs)["fault"].dropna()) == {"hash_routing_ignored"}


@pytest.mark.parity
def test_cli_exit_codes_for_a_missed_fault_and_bad_prompts(tmp_path: Path) -> None:
    mod = tmp_path / "harmless_faults.py"
    mod.write_text('from parity.bugzoo import register_fault\n'
                   '@register_fault("test_cli_harmless", layer=0, component="attention", column="logic",\n'
                   '                description="patches nothing: the zoo must report it as missed")\n'
                   'def harmless(model):\n    yield\n')
    try:
        con, buf = _console()
        rc = zoo_main(["--faults-module", str(mod), "--fault", "test_cli_harmless", "--no-clean"], console=con)
        assert rc == 1, buf.getvalue()
        assert "0/1 faults caught" in buf.getvalue() and "FAIL" in buf.getvalue()
    finally:
        unregister_fault("test_cli_harmless")
    con, buf = _console()
    assert zoo_main(["--fault", "hash_routing_ignored", "--prompt-set", str(tmp_path / "none.toml")], console=con) == 2
    assert "expected a TOML file" in buf.getvalue()
