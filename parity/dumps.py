"""The engine dump format ("bring your own engine") and a converter from the native model.

A dump is one prompt's prefill by some engine, in a directory::

    DIR/manifest.json       {"format": "dsv4-parity-dump", "format_version": 1, "engine": "my-engine",
                             "token_ids": [...], "prompt_mode": "chat"|"thinking", "dtype": "bfloat16",
                             "probes": [names in emission order], "prompt_id": optional id of the
                             standard prompt set, "prompt_text": optional rendered prompt,
                             "probe_subset": optional true when the engine gives only some probes}
    DIR/probes.safetensors  one tensor per probe, keyed by the probe name of docs/model_surface.md
                            (shapes as listed there; logits fp32 [T, V])

Several dumps (one per prompt) go in subdirectories of one directory. ``python -m
parity.compare_dumps --dumps DIR`` compares them against the reference. The example converter::

    python -m parity.dumps --from-native --checkpoint tiny --plan default --mode chat --out DIR

writes the native model's own probes in this format (what another engine would write).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from .inputs import EncodedPrompt
    from .runner import ModelLoaders



from dsv4.checkpoint.builtin import add_checkpoint_argument
from .cli import EXIT_PASS, outputs_of, parse_device, run_cli, set_threads

FORMAT = "dsv4-parity-dump"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "probes.safetensors"
_REQUIRED = ("format", "format_version", "engine", "token_ids", "prompt_mode", "dtype", "probes")


@dataclass
class Dump:
    path: Path
    manifest: dict[str, Any]
    probes: dict[str, torch.Tensor]

    @property
    def engine(self) -> str:
        return str(self.manifest["engine"])

    @property
    def token_ids(self) -> list[int]:
        return list(self.manifest["token_ids"])

    @property
    def prompt_mode(self) -> str:
        return str(self.manifest["prompt_mode"])

    @property
    def prompt_id(self) -> str:
        return str(self.manifest.get("prompt_id") or self.path.name)


def write_dump(out: str | Path, probes: Mapping[str, torch.Tensor], *, engine: str, token_ids: Sequence[int],
               prompt_mode: str, prompt_id: str | None = None, prompt_text: str | None = None,
               dtype: str | None = None, probe_subset: bool = False) -> Path:
    """Write one dump atomically (a temporary directory renamed into place; an existing dump at
    ``out`` is replaced). ``probe_subset``: the engine can give only some probes (e.g. hooks on module
    outputs); the manifest says so and the comparison judges those it has."""
    from safetensors.torch import save_file
    from dsv4.encoding import THINKING_MODES
    from dsv4.probes import parse_probe
    from .errors import DumpError

    out = Path(out)
    for name in probes:
        try:
            parse_probe(name)
        except KeyError as e:
            raise DumpError(f"write_dump: {e.args[0]}") from None
    if prompt_mode not in THINKING_MODES:
        raise DumpError(f"write_dump: prompt_mode: expected one of {list(THINKING_MODES)}, found {prompt_mode!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file({n: t.detach().to("cpu").contiguous() for n, t in probes.items()}, str(tmp / TENSORS))
        act = dtype or next((str(t.dtype).removeprefix("torch.") for n, t in probes.items()
                             if n.endswith(".out") and t.is_floating_point()), "unknown")
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "engine": engine,
                    "token_ids": [int(i) for i in token_ids], "prompt_mode": prompt_mode, "dtype": act,
                    "probes": list(probes), "prompt_id": prompt_id, "prompt_text": prompt_text,
                    **({"probe_subset": True} if probe_subset else {})}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_dump(path: str | Path) -> Dump:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from dsv4.encoding import THINKING_MODES
    from .errors import DumpError

    d = Path(path)
    try:
        manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DumpError(f"dump {d}: expected {MANIFEST}, found none") from None
    except json.JSONDecodeError as e:
        raise DumpError(f"dump {d}: {MANIFEST}: expected JSON, found invalid JSON ({e.msg})") from None
    if not isinstance(manifest, dict):
        raise DumpError(f"dump {d}: {MANIFEST}: expected a JSON object")
    _check_schema(d, manifest)
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise DumpError(f"dump {d}: {MANIFEST}: missing keys {missing} (required: {list(_REQUIRED)})")
    if manifest["format"] != FORMAT or manifest["format_version"] != FORMAT_VERSION:
        raise DumpError(f"dump {d}: expected format {FORMAT!r} version {FORMAT_VERSION}, found "
                        f"{manifest['format']!r} version {manifest['format_version']!r}")
    if manifest["prompt_mode"] not in THINKING_MODES:
        raise DumpError(f"dump {d}: prompt_mode: expected one of {list(THINKING_MODES)}, found "
                        f"{manifest['prompt_mode']!r}")
    ids = manifest["token_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DumpError(f"dump {d}: token_ids: expected a non-empty list of ints")
    try:
        tensors = load_file(str(d / TENSORS))
    except FileNotFoundError:
        raise DumpError(f"dump {d}: expected {TENSORS}, found none") from None
    except (SafetensorError, OSError) as e:
        raise DumpError(f"dump {d}: {TENSORS}: not a readable safetensors file ({e})") from None
    listed = list(manifest["probes"])
    absent = [n for n in listed if n not in tensors]
    if absent:
        raise DumpError(f"dump {d}: manifest lists probes missing from {TENSORS}: {absent[:8]}")
    _check_tensors(d, tensors, len(ids))
    order = listed + [n for n in tensors if n not in listed]
    return Dump(d, manifest, {n: tensors[n] for n in order})


SCHEMA = Path(__file__).with_name("dump_manifest.schema.json")
# Probes whose rows are compressed entries (N), not tokens, and the integer-valued ones (docs/model_surface.md).
_ENTRY_ROWS = ("attn.compressed_kv", "attn.indexer.k")
_INTEGER = ("ffn.router.topk_ids", "attn.indexer.topk")


def _check_schema(d: Path, manifest: dict) -> None:
    """The manifest against parity/dump_manifest.schema.json: the first violation, with its JSON path."""
    from .errors import DumpError

    try:
        import jsonschema
    except ImportError:   # a machine without it (the GPU box has no registry): the checks below still run
        return

    errors = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).iter_errors(manifest)
    err = min(errors, key=lambda e: [str(p) for p in e.absolute_path], default=None)   # the first, by path
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise DumpError(f"dump {d}: {MANIFEST} {where}: {err.message} (schema {SCHEMA.name}, format_version "
                        f"{FORMAT_VERSION})")


def _check_tensors(d: Path, tensors: Mapping[str, Any], n_tokens: int) -> None:
    """Every probe's name is known, its rows are the manifest's token count (entry probes excepted),
    integer ids for the selections, floats for everything else."""
    from dsv4.probes import parse_probe
    from .errors import DumpError

    for name, t in tensors.items():
        try:
            _, suffix = parse_probe(name)
        except KeyError as e:
            raise DumpError(f"dump {d}: {e.args[0]}") from None
        if t.dim() == 0:
            raise DumpError(f"dump {d}: probe {name}: expected a tensor with a token dimension, found a scalar")
        if suffix not in _ENTRY_ROWS and int(t.shape[0]) != n_tokens:
            raise DumpError(f"dump {d}: probe {name}: expected {n_tokens} rows (one per token of token_ids), "
                            f"found shape {list(t.shape)}")
        integer = suffix in _INTEGER
        if integer == t.is_floating_point():
            raise DumpError(f"dump {d}: probe {name}: expected {'an integer' if integer else 'a floating'} dtype, "
                            f"found {str(t.dtype).removeprefix('torch.')}")


def find_dumps(root: str | Path) -> list[Path]:
    """``root`` itself when it holds a manifest, else its subdirectories that do (sorted)."""
    from .errors import DumpError

    r = Path(root)
    if not r.is_dir():
        raise DumpError(f"--dumps: expected a directory, found nothing at {r}")
    if (r / MANIFEST).exists():
        return [r]
    found = sorted(p.parent for p in r.glob(f"*/{MANIFEST}"))
    if not found:
        raise DumpError(f"--dumps {r}: expected {MANIFEST} in it or in its subdirectories, found none")
    return found


def dump_from_native(model: Any, prompts: Sequence[EncodedPrompt], out: str | Path, *, engine: str,
                     device: str = "cpu") -> list[Path]:
    """Run ``model`` (any model of the surface) on each prompt and write one dump per prompt in
    ``out/<prompt id>/``: the documented example of producing a dump."""
    from .runner import run_propagated

    paths = []
    for p in prompts:
        side = run_propagated(model, p.tensor(), device)
        paths.append(write_dump(Path(out) / p.id, side.probes, engine=engine, token_ids=p.ids, prompt_mode=p.mode,
                                prompt_id=p.id, prompt_text=p.text))
    return paths


def main(argv: Sequence[str] | None = None, *, loaders: ModelLoaders | None = None,
         console: Console | None = None) -> int:
    from dsv4.encoding import THINKING_MODES

    ap = argparse.ArgumentParser(prog="python -m parity.dumps", description="Write engine dumps (see module doc).")
    ap.add_argument("--from-native", action="store_true", required=True,
                    help="dump the native model's own probes (the example converter)")
    add_checkpoint_argument(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan", default="default")
    ap.add_argument("--backend", default="emulated")
    ap.add_argument("--mode", choices=THINKING_MODES, default="chat")
    ap.add_argument("--prompt", action="append")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    def body(console: Console) -> int:
        from dsv4.plan import resolve_plan
        from .inputs import encode_prompts, select_prompts
        from .runner import DefaultLoaders
        from .source import resolve_checkpoint

        plan = resolve_plan(args.plan)
        device = parse_device(args.device)
        src = resolve_checkpoint(args.checkpoint, args.seed)
        set_threads(None, device, src.config)
        prompts = encode_prompts(select_prompts(args.mode, args.prompt), src.tokenizer, src.config.vocab_size)
        model = (loaders or DefaultLoaders()).native(str(src.path), plan=plan, backend=args.backend, device=device,
                                                     device_map=None)
        paths = dump_from_native(model, prompts, args.out, engine=f"dsv4-native:{plan.name}/{args.backend}",
                                 device=device)
        for p in paths:
            console.print(f"wrote {p}")
        return EXIT_PASS

    return run_cli(body, console, outputs_of(args, out="dir"))


if __name__ == "__main__":
    sys.exit(main())
