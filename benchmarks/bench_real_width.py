"""Real-width layer bench: per layer kind, what a parity verdict costs at Flash / Pro width.

    python benchmarks/bench_real_width.py --model flash --out $OUT/real_width_h100.json
    python benchmarks/bench_real_width.py --model pro --out $OUT/real_width_pro_h100.json
    python benchmarks/bench_real_width.py --width tiny --prefill 32,64 --decode-cache 64 --out /tmp/rw.json  # CPU

A synthetic checkpoint holding one layer of every kind at the model's exact shapes (Flash: window,
CSA and HCA attention; hash- and score-routed MoE with 256 experts, top-6; the 129280-token vocab
for the head. Pro has no window layer) is generated and quantized on the device
(``real_width_synth``: the project's weight list, names, formats and writer; torch encoders) and
written under ``--workdir`` twice: in the official layout (FP8 + MXFP4 experts) for the streaming
reference, then in the NVFP4 (ModelOpt) layout for the native model and the harness; each is deleted
when its stages are done (a Pro layer is ~13 GB per layout). Then, each stage timed per layer:

1. the streaming reference (weights read per layer, as a parity run loads it: above 256 MiB) prefilling ``--prefill`` tokens, layer by layer
   through the model surface: seconds, peak GPU memory, host RSS and bytes read from disk (page cache
   of the shards dropped first with posix_fadvise, so the reads are cold);
2. the native model on ``emulated`` and on each other ``--backends`` name (``cutedsl_sm90``; skipped
   with its reason where it does not execute), same prefills, each length once untimed first (a new
   token count compiles its kernels);
   Then, at the first prefill length, what capturing the probes costs a forward: plain, with
   synchronous pageable host copies, and with the harness's pinned non-blocking ones (``probe_capture_cost.py``);
3. decode: ``--decode-steps`` steps after a prefill of ``--decode-cache`` tokens (the biggest cache
   that fits the remaining budget, halved until it does), per layer per step;
4. the full harness (``run_threeway``: probes, isolated pass, metrics, the kernel audit where a
   kernel backend runs) at each prefill, its time beside the plain forwards it performs. The plain
   reference forward is timed again on the layout the harness reads (NVFP4; step 1 read the official
   one): the overhead compares like with like (``plain_forward_seconds_official_reference`` keeps the
   figure from step 1's run).

Targets measured as ratios in the same run: harness overhead = harness time (loads excluded) / the
plain forwards it performs - 1 (target <= 0.25); streaming reference peak GPU memory <= one layer's
weights + touched experts + activations + 2 GiB, and flat in layer count (peak after the last layer /
peak after layer 2). Every stage checks the remaining ``--budget-s`` first (estimated from what ran)
and is skipped with its reason rather than overrun; a stage that fails (out of memory, a missing
kernel) is recorded with its error and the bench goes on. The JSON is rewritten after every stage.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_width_meter import Meter, drop_page_cache, machine  # noqa: E402  (this directory)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LAYERS = {("flash", "real"): 4, ("pro", "real"): 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_real_width.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("flash", "pro"), default="flash")
    p.add_argument("--width", choices=("real", "medium", "tiny"), default="real",
                   help="real: the model's exact shapes; medium (D=1024) and tiny (D=256): the same code path, small")
    p.add_argument("--layers", type=int, default=None,
                   help="layers in the synthetic checkpoint (default: flash 4, pro 2 at real width, else 8); "
                        "the flatness ratio compares the peak after layer 2 with the peak after the last")
    p.add_argument("--prefill", default="1024,8192", help="comma-separated prefill lengths (tokens)")
    p.add_argument("--long", action="store_true", help="also prefill 32768 tokens")
    p.add_argument("--decode-cache", type=int, default=32768, help="tokens in the cache before the decode steps")
    p.add_argument("--decode-steps", type=int, default=4)
    p.add_argument("--backends", default="emulated,cutedsl_sm90", help="native backends, comma-separated")
    p.add_argument("--no-harness", action="store_true", help="skip the run_threeway stage")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--workdir", default="/tmp/dsv4-real-width", help="where the checkpoints are written")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints")
    p.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget; stages past it are skipped")
    p.add_argument("--out", required=True, help="JSON results")
    a = p.parse_args(argv)
    try:
        a.prefill_list = sorted({int(x) for x in a.prefill.split(",") if x.strip()} | ({32768} if a.long else set()))
    except ValueError:
        p.error(f"--prefill: expected comma-separated integers, found {a.prefill!r}")
    if not a.prefill_list or min(a.prefill_list) < 2 or a.decode_cache < 2 or a.decode_steps < 1:
        p.error(f"--prefill / --decode-cache: expected lengths >= 2 and --decode-steps >= 1, found "
                f"{a.prefill!r} / {a.decode_cache} / {a.decode_steps}")
    a.layers = a.layers or DEFAULT_LAYERS.get((a.model, a.width), 8)
    if a.layers < 2:
        p.error(f"--layers: expected >= 2, found {a.layers}")
    return a


# ---- the synthetic model --------------------------------------------------------------------------
def bench_config(model: str, width: str, layers: int) -> Any:
    """The model's config with ``layers`` layers covering its layer kinds: Flash [window, CSA] hash-routed
    then [HCA, CSA, ...] score-routed; Pro [HCA] hash then [CSA, HCA, ...] score (Pro has no window)."""
    from dataclasses import replace

    from dsv4.config import preset

    real = preset(model)
    if width == "real":
        c = real
    elif width == "medium":
        def hca16(ratios: tuple[int, ...]) -> tuple[int, ...]:   # the HCA ratio, wherever it is scheduled
            return tuple(16 if r == real.hca_ratio else r for r in ratios)
        c = replace(real, vocab_size=8192, hidden_size=1024, num_attention_heads=8, head_dim=128, q_lora_rank=256,
                    o_lora_rank=256, o_groups=2, index_n_heads=4, index_head_dim=128, index_topk=64,
                    n_routed_experts=32, moe_intermediate_size=512, hca_ratio=16,
                    compress_ratios=hca16(real.compress_ratios), mtp_compress_ratios=hca16(real.mtp_compress_ratios))
    else:
        c = replace(preset("tiny"), n_routed_experts=8, num_experts_per_tok=2)
    h = c.hca_ratio
    pattern = [0, 4] + [h, 4] * layers if model == "flash" else [h] + [4, h] * layers
    n_hash = 2 if model == "flash" else 1
    return replace(c, name=f"{model}-{width}-bench", num_hidden_layers=layers,
                   compress_ratios=tuple(pattern[:layers]), num_hash_layers=min(n_hash, layers - 1),
                   num_nextn_predict_layers=0, mtp_compress_ratios=(0,))


def layer_kind(c: Any, i: int) -> str:
    return f"{c.layer_kind(i)}/{'hash' if i < c.num_hash_layers else 'score'}"


def stored_bytes_per_layer(path: Path) -> dict[int, int]:
    from dsv4.checkpoint.reader import open_checkpoint

    r = open_checkpoint(path)
    sizes = {"F32": 4, "I64": 8, "I32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "U8": 1, "I8": 1}
    out: dict[int, int] = {}
    for name in r.tensor_names():
        parts = name.split(".")
        idx = next((int(p) for p in parts[:3] if p.isdigit()), None)
        if idx is None or "layers" not in parts[:2]:
            continue
        info = r.tensor_info(name)
        n = 1
        for s in info.shape:
            n *= s
        out[idx] = out.get(idx, 0) + n * sizes.get(info.dtype, 1)
    return out


# ---- measuring ----------------------------------------------------------------------------------------
def layerwise(model: Any, ids: Any, meter: Meter, c: Any) -> dict[str, Any]:
    """embed, every layer, head, each measured; the peaks after layer 2 and after the last (not reset)."""
    from dsv4.probes import suspended

    rows = []
    ids = ids.to(meter.device)
    with meter.torch.no_grad(), suspended():
        state, _ = meter.run(lambda: model.new_state(ids))
        X, m_embed = meter.run(lambda: model.embed(ids))
        cum_after = {}
        if meter.cuda:
            meter.torch.cuda.reset_peak_memory_stats()
        for i in range(c.num_hidden_layers):
            X, m = meter.run(lambda: model.layer(i, X, state), reset_peak=False)
            rows.append({"index": i, "kind": layer_kind(c, i), **m})
            if i + 1 in (2, c.num_hidden_layers):
                cum_after[str(i + 1)] = {"peak_gpu_bytes": m["peak_gpu_bytes"], "host_peak_rss_bytes": m["host_peak_rss_bytes"]}
            if meter.cuda:
                meter.torch.cuda.reset_peak_memory_stats()
        _, m_head = meter.run(lambda: model.head(X))          # every position's logits, as a parity run
    return {"layers": rows, "embed": m_embed, "head": m_head, "cumulative_peak_after_layers": cum_after,
            "total_seconds": m_embed["seconds"] + m_head["seconds"] + sum(r["seconds"] for r in rows),
            "_state": state}


def decode_steps(model: Any, state: Any, steps: int, meter: Meter, c: Any, native: bool) -> dict[str, Any]:
    """Per layer and step: one token through the model surface (the bookkeeping decode_step does first)."""
    from dsv4.probes import suspended

    import torch

    per: dict[int, list[float]] = {i: [] for i in range(c.num_hidden_layers)}
    step_s = []
    with torch.no_grad(), suspended():
        for s in range(steps + 1):      # step 0 warms up (the one-token kernels compile): not counted
            tok = (7 * s + 3) % c.vocab_size
            t0 = time.perf_counter()
            if native:
                model.begin_decode_step(state, tok)
                ids = state.chunk.to(meter.device)
            else:   # reference.ReferenceModel.decode_step's own two lines, then the surface layer by layer
                state.ids, state.start = torch.tensor([tok], dtype=torch.int64), state.pos
                ids = state.ids.to(meter.device)
            X, _ = meter.run(lambda: model.embed(ids))
            for i in range(c.num_hidden_layers):
                X, m = meter.run(lambda: model.layer(i, X, state))
                per[i].append(m["seconds"])
            meter.run(lambda: model.head(X))
            step_s.append(time.perf_counter() - t0)
    return {"steps": steps, "warmup_step_seconds": step_s[0], "step_seconds": step_s[1:],
            "layers": [{"index": i, "kind": layer_kind(c, i), "seconds_per_step": statistics.median(v[1:])}
                       for i, v in per.items()]}


def harness_phases(r: Any, wall: float, loads: float, forwards: float) -> dict[str, float]:
    """Where the harness's wall time went (the values add up to ``wall``): loads, the forwards without
    the oracle's per-call replays made inside them, those replays, per column the weight audit, the
    probe comparisons and the audit records, and the rest (reference cache, records, verdict)."""
    cols: dict[str, float] = {}
    for col in r.columns.values():
        for k, v in col.phase_seconds.items():
            cols[k] = cols.get(k, 0.0) + v
    replay = cols.pop("audit_replay", 0.0)
    return {"loads": loads, "forwards_without_audit_replay": forwards - replay, "audit_replay": replay, **cols,
            "other": wall - loads - forwards - sum(cols.values())}


def per_prompt_overhead(phases: dict[str, float], plain: float | None) -> float | None:
    """The overhead a further prompt adds: the harness's time without the loads and the weight audit
    (both once per checkpoint, whatever the prompt count) over the plain forwards, minus 1."""
    if not plain:
        return None
    per_checkpoint = phases["loads"] + phases.get("weight_audit", 0.0)
    return (sum(phases.values()) - per_checkpoint) / plain - 1


# ---- the run ---------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        import torch

        self.a, self.torch = a, torch
        self.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.t0 = time.perf_counter()
        self.meter = Meter(self.device)
        self.c = bench_config(a.model, a.width, a.layers)
        self.res: dict[str, Any] = {"bench": "real_width", "model": a.model, "width": a.width,
                                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(self.device),
                                    "config": config_summary(self.c), "budget_s": a.budget_s, "runs": [], "decode": [],
                                    "harness": [], "probe_capture": [], "skipped": [], "build": {},
                                    "args": sys.argv[1:]}
        self.estimates: dict[str, float] = {}
        self.decodes: list[tuple[str, Path]] = []

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f} s] {msg}", flush=True)

    def save(self) -> None:
        from dsv4.atomic_io import atomic_write_text

        self.res["wall_s"] = time.perf_counter() - self.t0
        atomic_write_text(self.a.out, json.dumps(self.res, indent=1, default=str) + "\n")

    def stage(self, name: str, fn: Any, estimate: float = 0.0) -> Any:
        """Run ``fn`` unless its estimate exceeds the remaining budget; record a failure and go on."""
        # a stage with no estimate yet starts only with a tenth of the budget left (a kernel's first
        # call may JIT-compile for minutes; the caller's own wall-clock limit must not cut a stage)
        if estimate > self.left() or self.left() < 0.1 * self.a.budget_s:
            self.res["skipped"].append({"stage": name, "reason": f"estimated {estimate:.0f} s, {self.left():.0f} s left "
                                                                 f"of the {self.a.budget_s:.0f} s budget"})
            self.log(f"skip {name}: estimated {estimate:.0f} s, {self.left():.0f} s left")
            return None
        self.log(f"{name} ...")
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as e:   # noqa: BLE001 - one stage's failure (OOM, no kernel) is a result, not the end
            self.res["skipped"].append({"stage": name, "reason": f"{type(e).__name__}: {str(e)[:400]}"})
            self.log(f"{name} failed: {type(e).__name__}: {str(e)[:200]}")
            out = None
        finally:
            self.free()
            self.save()
        self.estimates[name] = time.perf_counter() - t0
        self.log(f"{name} done in {self.estimates[name]:.1f} s")
        return out

    def free(self) -> None:
        import gc

        gc.collect()
        if self.meter.cuda:
            self.torch.cuda.empty_cache()

    def guess(self, prefix: str, tokens: int) -> float:
        """A stage's time from the same stage at the largest shorter length, scaled linearly, x1.5."""
        done = [(int(k.rsplit("@", 1)[1]), v) for k, v in self.estimates.items() if k.startswith(prefix + "@")]
        done = [(t, v) for t, v in done if t < tokens]
        if not done:
            return 0.0
        t, v = max(done)
        return 1.5 * v * tokens / t

    def ids(self, n: int) -> Any:
        g = self.torch.Generator().manual_seed(n)
        return self.torch.randint(2, self.c.vocab_size, (n,), generator=g)

    # ---- stages -------------------------------------------------------------------------------------
    def build(self, flavor: str) -> Path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import real_width_synth

        out = Path(self.a.workdir) / f"{self.c.name}-{flavor}"
        if not (out / "config.json").exists():
            _, m = self.meter.run(lambda: real_width_synth.write(out, self.c, flavor, device=self.device))
            self.res["build"][flavor] = {**m, "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors")),
                                         "per_layer_bytes": stored_bytes_per_layer(out)}
        return out

    def reference(self, path: Path) -> None:
        import reference

        for T in self.a.prefill_list:
            def run(T: int = T) -> None:
                drop_page_cache(path)
                # the harness's own policy (cache_weights=None): streaming above 256 MiB of tensors, so at
                # real and medium width; the tiny checkpoints are cached, as in a parity run
                m = reference.load_model(str(path), device=self.device)
                out = layerwise(m, self.ids(T), self.meter, self.c)
                out.pop("_state")
                self.res["runs"].append({"side": "reference", "backend": "reference(streaming)", "phase": "prefill",
                                         "tokens": T, "streaming": not m.describe()["cache_weights"], **out})
            self.stage(f"reference@{T}", run, self.guess("reference", T))
        self.stage("reference-decode", lambda: self.decode_run("reference", lambda: reference.load_model(
            str(path), device=self.device), native=False), 0.0)

    def native(self, path: Path, backend: str) -> bool:
        import dsv4
        from probe_capture_cost import probe_capture_cost
        from dsv4.kernels.registry import BackendError, resolve_backend

        try:
            resolve_backend(backend, self.device)
        except (BackendError, Exception) as e:   # noqa: BLE001 - any reason it cannot run here is the reason
            self.res["skipped"].append({"stage": f"native:{backend}", "reason": f"{type(e).__name__}: {e}"})
            self.log(f"skip native:{backend}: {e}")
            return False
        holder: dict[str, Any] = {}

        def load() -> None:
            drop_page_cache(path)
            holder["m"], m = self.meter.run(lambda: dsv4.load_model(str(path), plan="default", backend=backend,
                                                                     device=self.device))
            self.res["runs"].append({"side": "native", "backend": backend, "phase": "load", **m})
        self.stage(f"native:{backend}:load", load)
        if "m" not in holder:
            return False
        for T in self.a.prefill_list:
            def run(T: int = T) -> None:
                # a new token count compiles its own kernel configurations (tile shapes follow M): on an
                # H100 the first layer at 1024 tokens took 2.33 s against 0.03 s for the next. Untimed
                # warm-up first, its seconds kept apart, so a layer's time is the steady state.
                _, w = self.meter.run(lambda: layerwise(holder["m"], self.ids(T), self.meter, self.c))
                self.res["runs"].append({"side": "native", "backend": backend, "phase": "warmup", "tokens": T,
                                         "seconds": w["seconds"], "peak_gpu_bytes": w["peak_gpu_bytes"]})
                out = layerwise(holder["m"], self.ids(T), self.meter, self.c)
                out.pop("_state")
                self.res["runs"].append({"side": "native", "backend": backend, "phase": "prefill", "tokens": T, **out})
            self.stage(f"native:{backend}@{T}", run, self.guess(f"native:{backend}", T))
        T0 = self.a.prefill_list[0]   # what capturing the probes costs a forward (probe_capture_cost.py)
        self.stage(f"probes:{backend}@{T0}", lambda: self.res["probe_capture"].append(
            {"backend": backend, **probe_capture_cost(holder["m"], self.ids(T0), self.device)}),
            3 * self.estimates.get(f"native:{backend}@{T0}", 0.0))
        self.decodes.append((backend, path))      # decode runs last: the prefills and the harness come first
        holder.clear()
        return True

    def decode_run(self, label: str, get_model: Any, native: bool) -> None:
        """The biggest cache (``--decode-cache``, halved) whose prefill fits the remaining budget."""
        prefix = "reference" if not native else f"native:{label}"
        n = self.a.decode_cache
        while n > 2 and self.guess(prefix, n) > min(0.6 * self.left(), 0.15 * self.a.budget_s):
            n //= 2
        model = get_model()
        while True:      # out of memory at n (the reference's dense scores grow as T^2): half the cache
            try:
                pre = layerwise(model, self.ids(n), self.meter, self.c)
                break
            except self.torch.OutOfMemoryError:
                self.free()
                if n <= 2:
                    raise
                self.log(f"{label} decode: out of memory prefilling {n} tokens; trying {n // 2}")
                n //= 2
        d = decode_steps(model, pre.pop("_state"), self.a.decode_steps, self.meter, self.c, native)
        self.res["decode"].append({"side": "native" if native else "reference", "backend": label,
                                   "cache_tokens": n, "requested_cache_tokens": self.a.decode_cache,
                                   "prefill_seconds": pre["total_seconds"], **d})

    def harness(self, path: Path, backend: str | None) -> None:
        from dsv4.plan import PrecisionPlan
        from parity.inputs import EncodedPrompt
        from parity.source import resolve_checkpoint
        from parity.threeway import RunSpec, run_threeway

        src_holder: dict[str, Any] = {}

        def source() -> None:
            src_holder["src"], m = self.meter.run(lambda: resolve_checkpoint(str(path)))
            self.res["source"] = {**m, "what": "resolve_checkpoint: fingerprint (sha256 of every shard) + "
                                               "verify_before_compute"}
        self.stage("source", source)
        if "src" not in src_holder:
            return
        for T in self.a.prefill_list:
            def run(T: int = T) -> None:
                ref_plain = self.plain_reference(path, T)
                prompt = EncodedPrompt(id=f"synthetic-{T}", mode="chat", text="", ids=tuple(self.ids(T).tolist()))
                cols = ("floor", "bug_budget") if backend else ("floor",)
                spec = RunSpec(source=src_holder["src"], prompts=[prompt], plan=PrecisionPlan.preset("default"),
                               backend=backend or "emulated", device=self.device, columns=cols)
                t0 = time.perf_counter()
                r = run_threeway(spec)
                wall = time.perf_counter() - t0
                loads = r.reference_load_seconds + sum(c.load_seconds for c in r.columns.values())
                fwd = sum(f.seconds for f in r.forwards)
                plain = self.plain_forwards(T, backend, ref_plain)
                phases = harness_phases(r, wall, loads, fwd)
                self.res["harness"].append({
                    "tokens": T, "backend": backend or "emulated", "columns": list(cols), "wall_seconds": wall,
                    "load_seconds": loads, "forward_seconds_in_harness": fwd, "plain_forward_seconds": plain,
                    "plain_reference_seconds": ref_plain,
                    "plain_forward_seconds_official_reference": self.plain_forwards(T, backend),
                    "records": len(r.records), "audit": {n: c.audit for n, c in r.columns.items() if c.audit},
                    "column_errors": {n: str(e)[:300] for n, e in r.column_errors.items()},
                    "overhead_ratio": (wall - loads) / plain - 1 if plain else None, "target": 0.25,
                    "per_prompt_overhead_ratio": per_prompt_overhead(phases, plain),
                    "phases": phases,
                    "forwards": [f.__dict__ for f in r.forwards]})
            self.stage(f"harness@{T}", run, self.guess("harness", T))

    def plain_reference(self, path: Path, T: int) -> float | None:
        """A plain streaming reference forward at T on the checkpoint the harness reads (the NVFP4 layout:
        the official one, which ``reference()`` timed, is gone by then), with the page cache as the harness
        finds it (its checkpoint fingerprint has just read every shard): the reference term of the plain
        forwards the harness is judged against, like for like. None where it ran out of memory (the
        official layout's figure is used then, and the log says so)."""
        import reference

        m = None
        try:
            m = reference.load_model(str(path), device=self.device)
            out = layerwise(m, self.ids(T), self.meter, self.c)
        except self.torch.OutOfMemoryError:
            self.log(f"plain reference@{T} on the harness's layout: out of memory; the official layout's time stands in")
            return None
        finally:
            del m
            self.free()
        out.pop("_state")
        return out["total_seconds"]

    def plain_forwards(self, T: int, backend: str | None, reference_seconds: float | None = None) -> float | None:
        """The forwards run_threeway performs at T, from this run's plain layer-by-layer timings: the
        reference once (``reference_seconds`` where given, else the official layout's run), the emulated
        plan propagated + isolated, and the kernel backend's the same."""
        def total(side: str, be: str) -> float | None:
            rows = [r for r in self.res["runs"] if r["side"] == side and r.get("backend") == be
                    and r["phase"] == "prefill" and r.get("tokens") == T]
            return rows[0]["total_seconds"] if rows else None
        ref = reference_seconds if reference_seconds is not None else total("reference", "reference(streaming)")
        parts = [ref, total("native", "emulated")]
        if backend:
            parts.append(total("native", backend))
        if any(p is None for p in parts):
            return None
        return parts[0] + 2 * sum(parts[1:])

    def targets(self) -> None:
        """The two targets of issue #43, as ratios from this run."""
        c = self.c
        over = [h["overhead_ratio"] for h in self.res["harness"] if h.get("overhead_ratio") is not None]
        per = [h["per_prompt_overhead_ratio"] for h in self.res["harness"] if h.get("per_prompt_overhead_ratio") is not None]
        self.res["targets"] = {"harness_overhead": {"target": 0.25, "measured": over,
                                                    "met": bool(over) and max(over) <= 0.25,
                                                    "per_prompt": per}}
        refs = [r for r in self.res["runs"] if r["side"] == "reference" and r["phase"] == "prefill"]
        if not refs:
            return
        r = refs[0]
        T = r["tokens"]
        per_layer = self.res["build"].get("official", {}).get("per_layer_bytes", {})
        experts = c.n_routed_experts * 3 * c.hidden_size * c.moe_intermediate_size
        non_expert = max((int(v) for v in per_layer.values()), default=0) - experts // 2   # MXFP4: 0.5 B/weight
        touched = min(c.n_routed_experts, T * c.num_experts_per_tok) * 3 * c.hidden_size * c.moe_intermediate_size * 2
        act = T * c.hc_mult * c.hidden_size * 4 * 8      # assumption: ~8 fp32 stream-sized temporaries
        bound = 2 * max(non_expert, 0) + touched + act + 2 * 2 ** 30   # non-expert weights dequantized to BF16
        peak = max(x["peak_gpu_bytes"] or x["host_peak_rss_bytes"] for x in r["layers"])
        cum = r["cumulative_peak_after_layers"]
        key = "peak_gpu_bytes" if self.meter.cuda else "host_peak_rss_bytes"
        flat = cum[str(c.num_hidden_layers)][key] / cum["2"][key] if "2" in cum and cum["2"][key] else None
        self.res["targets"]["streaming_memory"] = {
            "tokens": T, "streaming": r.get("streaming"), "measured_peak_bytes": peak, "measured_on": "gpu" if self.meter.cuda else "host rss",
            "bound_bytes": bound, "ratio_to_bound": peak / bound, "met": peak <= bound,
            "bound_terms": {"layer_weights_bf16": 2 * max(non_expert, 0), "touched_experts_bf16": touched,
                            "activations": act, "slack": 2 * 2 ** 30},
            "flat_ratio": flat, "flat_layers": [2, c.num_hidden_layers],
            "assumptions": "activations = 8 fp32 [T, hc, D] temporaries; experts dequantized to BF16 one layer at a "
                           "time; host RSS includes the Python/torch baseline (CPU runs)"}

    def main(self) -> int:
        a, limit, longest = self.a, self.c.max_position_embeddings, max(self.a.prefill_list)
        if longest > limit:     # before any checkpoint is built
            raise SystemExit(f"--prefill: expected lengths <= {limit} (max_position_embeddings of {self.c.name}), "
                             f"found {longest}")
        if a.decode_cache + a.decode_steps + 1 > limit:    # + the warm-up step
            self.log(f"--decode-cache {a.decode_cache}: {limit - a.decode_steps - 1} ({self.c.name} holds {limit} positions)")
            a.decode_cache = limit - a.decode_steps - 1
        self.log(f"{self.c.name}: {self.c.num_hidden_layers} layers {[layer_kind(self.c, i) for i in range(self.c.num_hidden_layers)]}, "
                 f"D={self.c.hidden_size}, E={self.c.n_routed_experts} top-{self.c.num_experts_per_tok}, "
                 f"V={self.c.vocab_size}; device {self.res['machine']['card']}; budget {a.budget_s:.0f} s")
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
        official = self.stage("build:official", lambda: self.build("official"))
        if official is not None:
            self.reference(official)
            if not a.keep:
                _rmtree(official)
        nvfp4 = self.stage("build:nvidia-nvfp4", lambda: self.build("nvidia-nvfp4"))
        if nvfp4 is not None:
            ran = [b for b in a.backends.split(",") if b.strip() and self.native(nvfp4, b.strip())]
            if not a.no_harness:     # its reference reads the NVFP4 layout (the official one is gone)
                kernel = next((b for b in ran if b != "emulated"), None)
                self.harness(nvfp4, kernel)
            for backend, path in self.decodes:
                self.stage(f"native:{backend}-decode", lambda b=backend, q=path: self.decode_run(
                    b, lambda: load_native(q, b, self.device), native=True))
            if not a.keep:
                _rmtree(nvfp4)
        self.targets()
        self.save()
        self.log(f"wrote {a.out}")
        return 0


def load_native(path: Path, backend: str, device: str) -> Any:
    import dsv4

    return dsv4.load_model(str(path), plan="default", backend=backend, device=device)


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)


def config_summary(c: Any) -> dict[str, Any]:
    keys = ("name", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
            "o_lora_rank", "index_topk", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "num_hash_layers", "compress_ratios", "hc_mult", "sliding_window")
    out = {k: getattr(c, k) for k in keys}
    out["layer_kinds"] = [layer_kind(c, i) for i in range(c.num_hidden_layers)]
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    return Bench(a).main()


if __name__ == "__main__":
    sys.exit(main())
