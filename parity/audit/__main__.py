"""``python -m parity.audit``: the exact kernel and weight audit of any backend (docs/audit.md).

  run     forward the standard prompts on a backend with every kernel call audited against the
          oracle's analytic bound; violating calls are exported as repro files under --out
  weights what the backend's kernels read for every NVFP4 weight vs the reference's dequantization
  replay  rerun one exported call (a repro file) through a backend and the oracle, without the model

Exit codes: 0 no violation, 1 violations, 2 bad input, 3 the tool itself failed.
``--backend`` takes any registered backend or a bug-zoo stand-in (``python -m parity.bugzoo --list``).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from dsv4.checkpoint.builtin import add_checkpoint_argument


def say(console: Any, text: str) -> None:
    """Plain text: coordinates like ``out[m=3, n=5]`` are not rich markup, and long lines wrap."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m parity.audit", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (("run", "audit every kernel call of a forward over the prompts"),
                       ("weights", "audit what the kernels read for every NVFP4 weight")):
        s = sub.add_parser(name, help=what)
        add_checkpoint_argument(s)
        s.add_argument("--seed", type=int, default=0, help="synthetic seed when --checkpoint is a tiny preset")
        s.add_argument("--plan", default="default", help="plan preset or TOML file (default: default)")
        s.add_argument("--backend", default="auto", help="backend to audit (default: auto, the best kernel "
                                                         "backend of the device; emulated where none)")
        s.add_argument("--device", default=None, help="cpu or cuda[:N] (default: best available)")
        s.add_argument("--threads", type=int, default=None, help="torch CPU threads")
        if name == "run":
            s.add_argument("--mode", choices=("chat", "thinking"), default="chat")
            s.add_argument("--prompt", action="append", help="prompt id or free text (repeatable)")
            s.add_argument("--prompt-set", default=None, help="a prompts TOML other than the standard set")
            s.add_argument("--out", default=None, help="directory for repro files (default: "
                                                       "reports/audit/<run id>/ when there are violations)")
            s.add_argument("--json", default=None, help="write the audit summary as JSON here")
    r = sub.add_parser("replay", help="rerun one repro file through a backend and the oracle")
    r.add_argument("file", help="a repro file written by `python -m parity.audit run`")
    r.add_argument("--backend", default=None, help="backend to rerun it on (default: the one recorded)")
    r.add_argument("--device", default=None, help="cpu or cuda[:N] (default: the recorded device if present)")
    return p


@contextlib.contextmanager
def usable_backend(name: str) -> Iterator[str]:
    """``name`` as a registry name: a registered backend as is, a bug-zoo stand-in (by backend or fault
    name) registered for the duration."""
    from dsv4.kernels.registry import available_backends

    from ..bugzoo.backends import installed
    from ..bugzoo.registry import list_faults
    from ..errors import ParityInputError

    if name == "auto" or name in available_backends():
        yield name
        return
    for f in list_faults():
        if f.backend is not None and name in (f.backend.name, f.name):
            with installed(f.backend) as registered:
                yield registered
            return
    zoo = sorted(f.backend.name for f in list_faults() if f.backend is not None)
    raise ParityInputError(f"--backend: expected a registered backend {sorted(available_backends())} or a bug-zoo "
                           f"stand-in {zoo}, found {name!r}")


def _load(args: Any, console: Any) -> tuple[Any, Any, str]:
    from dsv4.model import load_model

    from ..cli import parse_device, set_threads
    from ..source import resolve_checkpoint

    device = parse_device(args.device)
    src = resolve_checkpoint(args.checkpoint, args.seed)
    set_threads(args.threads, device, src.config)
    backend = args.backend
    if backend == "auto":
        from ..threeway import resolve_kernel_backend
        backend = resolve_kernel_backend("auto", device)[0] or "emulated"
    say(console, f"audit: {src.config_name} plan {args.plan} on {backend} ({device})")
    model = load_model(str(src.path), plan=args.plan, backend=backend, device=device)
    return src, model, device


def cmd_weights(args: Any, console: Any) -> int:
    from ..cli import EXIT_FAIL, EXIT_PASS
    from . import audit_weights

    with usable_backend(args.backend) as args.backend:
        _, model, _ = _load(args, console)
        wa = audit_weights(model, progress=lambda i, n: say(console, f"  weights: {i}/{n} modules")
                           if i == n or i % 20 == 0 else None)
    for m in wa.mismatches:
        say(console, f"MISMATCH {m.describe()}")
    say(console, f"weight audit on {wa.backend}: {wa.modules} modules, {wa.weights:,} weights, "
                  f"{len(wa.mismatches)} mismatching -> {'PASS' if wa.passed else 'FAIL'}")
    return EXIT_PASS if wa.passed else EXIT_FAIL


def cmd_run(args: Any, console: Any) -> int:
    from ..cli import EXIT_FAIL, EXIT_PASS, EXIT_TOOL_FAILED
    from ..inputs import encode_prompts, select_prompts
    from ..records import atomic_write_json, new_run_id
    from . import CallAuditor, export_repro

    run_id = new_run_id()
    failure = None
    with usable_backend(args.backend) as args.backend:
        src, model, device = _load(args, console)
        prompts = encode_prompts(select_prompts(args.mode, args.prompt, args.prompt_set), src.tokenizer,
                                 src.config.vocab_size)
        auditor = CallAuditor()
        try:
            with auditor.attached(model):
                for n, p in enumerate(prompts):
                    auditor.prompt_id = p.id
                    model(p.tensor().to(device))
                    say(console, f"  [{n + 1}/{len(prompts)}] {p.id}: {auditor.calls} calls audited, "
                                  f"{len(auditor.violations)} violating so far")
        except Exception as e:   # the forward broke: what was audited so far is still reported and written
            failure = f"{type(e).__name__}: {e}"
            say(console, f"ERROR the forward failed after {auditor.calls} audited calls: {failure}")
    for v in auditor.violations[:20]:
        say(console, f"VIOLATION {v.describe()}")
    for e in auditor.errors:
        say(console, f"ERROR {e}")
    files = []
    if auditor.kept:
        out = Path(args.out) if args.out else Path("reports") / "audit" / run_id
        for kc in auditor.kept:
            v = kc.violation
            name = f"{v.module}.{v.op}.call{v.call_index}.safetensors"
            plan_entry = f"{v.component} = {model.plan.fmt(v.component)} (plan {model.plan.name})"
            files.append(str(export_repro(out / name, kc.call, v, plan_entry=plan_entry, device=device)))
        say(console, f"repro files ({len(files)}) in {out}: rerun one with `python -m parity.audit replay FILE`")
    s = auditor.summary()
    if args.json:   # always written, also when the forward failed (then "failure" says how)
        atomic_write_json(args.json, {**s, "run_id": run_id, "repros": files, "failure": failure,
                                      "backend": args.backend, "device": device,
                                      "violating": [v.summary() for v in auditor.violations]})
    worst = "exact elements missed" if s["worst_ratio"] == float("inf") else f"worst {s['worst_ratio']:.3g} bounds"
    say(console, f"kernel audit on {args.backend}: {s['calls']} calls, {s['violating_calls']} violating "
                  f"({s['violations']} elements), {worst} -> "
                  f"{'INCOMPLETE' if failure else 'PASS' if auditor.passed else 'FAIL'}")
    if failure:
        return EXIT_TOOL_FAILED
    return EXIT_PASS if auditor.passed else EXIT_FAIL


def cmd_replay(args: Any, console: Any) -> int:
    from dsv4.kernels.registry import get_backend

    from ..cli import EXIT_FAIL, EXIT_PASS, parse_device
    from .repro import load_repro, replay

    device = parse_device(args.device) if args.device else "cpu"
    header, call = load_repro(args.file, device)
    name = args.backend or header["backend"]
    say(console, f"repro: {header['module']} ({header['component']}) {header['op']} call #{header['call_index']}, "
                  f"recorded on {header['backend']}; replaying on {name} ({device})")
    with usable_backend(name) as registered:
        check = replay(call, get_backend(registered, device))
    for e in check.examples:
        say(console, f"  {e.describe()}")
    say(console, f"{check.violations} of {check.elements} elements out of bound, worst {check.worst_ratio:.3g} "
                  f"bounds -> {'PASS' if check.passed else 'FAIL'}")
    return EXIT_PASS if check.passed else EXIT_FAIL


def main(argv: Sequence[str] | None = None, console: Any = None) -> int:
    args = build_parser().parse_args(argv)

    from ..cli import outputs_of, run_cli

    cmd = {"run": cmd_run, "weights": cmd_weights, "replay": cmd_replay}[args.command]
    return run_cli(lambda c: cmd(args, c), console, outputs_of(args, out="dir"))


if __name__ == "__main__":
    sys.exit(main())
