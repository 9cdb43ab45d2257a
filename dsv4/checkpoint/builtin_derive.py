"""Layouts of the trained built-ins that are derived on first use, not shipped.

The repository ships each trained model once: ``tiny-trained-official`` (the layout training wrote)
and ``tiny-trained-dspark-draft`` (only the DSpark draft's ``mtp.*`` tensors and the 0731 config; the
target's weights are ``tiny-trained-official``'s). Every other layout is rebuilt from those by a
recipe in ``data/models/derived.json`` (the project's converter, or the target joined with the draft)
into the cache, and each rebuilt file must have the sha256 recorded there: the bytes of the directory
that used to be shipped. Built in a temporary directory and renamed into place, so concurrent first
uses (test workers, torchrun ranks) are safe; a directory that is in place was verified when built.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from ..atomic_io import file_mode
from .cache import cache_root
from .errors import CheckpointError

MODELS_DIR = Path(__file__).resolve().parent.parent / "data" / "models"
MANIFEST = MODELS_DIR / "derived.json"


@lru_cache(maxsize=1)
def recipes() -> dict[str, dict]:
    return {k: v for k, v in json.loads(MANIFEST.read_text()).items() if isinstance(v, dict)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def derived_dir(name: str) -> Path:
    """Where the derived directory ``name`` lives in the cache: keyed by the digests it must have, so
    a changed recipe never reads a stale directory. The leaf keeps the layout's directory name."""
    key = hashlib.sha256(json.dumps(recipes()[name]["sha256"], sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "builtin" / key / name


def source_dir(name: str) -> Path:
    """A shipped directory, or a derived one (built first if missing)."""
    return materialize(name) if name in recipes() else MODELS_DIR / name


def materialize(name: str) -> Path:
    final = derived_dir(name)
    if (final / "config.json").is_file():
        return final
    r = recipes()[name]
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    try:
        build = tmp / name
        if r["recipe"] == "convert":
            _convert(source_dir(r["source"]), r["flavor"], build)
        elif r["recipe"] == "join_draft":
            _join_draft(source_dir(r["source"]), MODELS_DIR / r["draft"], build)
        else:
            raise CheckpointError(f"{MANIFEST}: {name}: recipe expected 'convert' or 'join_draft', found {r['recipe']!r}")
        _verify(name, build, r["sha256"])
        try:
            os.rename(build, final)
        except OSError:
            if not (final / "config.json").is_file():   # not a lost race with another process: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert(src: Path, flavor: str, out: Path) -> None:
    """The project's converter, run as its CLI in a child process: the checkpoint package's readers and
    writers depend on dsv4.config, which resolves the built-in names through this module, so an
    in-process call would close an import cycle (tests/test_import_rooms.py)."""
    import subprocess
    import sys

    root = str(MODELS_DIR.parents[2])    # the directory holding the dsv4 package, for a source checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-m", "dsv4.checkpoint.convert", str(src), "--flavor", flavor, "--out",
                        str(out)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise CheckpointError(f"built-in {out.name}: expected the converter to write it from {src}, found exit "
                              f"{r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}")


def _verify(name: str, built: Path, expected: dict[str, str]) -> None:
    got = {f.name: _sha256(f) for f in sorted(built.iterdir())}
    if got != expected:
        diff = sorted(set(got) ^ set(expected)) or [f for f in expected if got.get(f) != expected[f]]
        raise CheckpointError(
            f"built-in {name}: rebuilt from the shipped files, expected the bytes recorded in {MANIFEST.name}, "
            f"found other bytes in {', '.join(diff)} (a converter or writer change? rerun the recipe and, if "
            f"the change is meant, record the new digests)")


def _join_draft(target: Path, draft: Path, out: Path) -> None:
    """The 0731 checkpoint: the target's tensors verbatim plus the draft's, one shard, the draft's config."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(target / "model.safetensors"))
    extra = load_file(str(draft / "draft.safetensors"))
    clash = sorted(set(tensors) & set(extra))
    if clash:
        raise CheckpointError(f"{draft}: expected only draft tensors (mtp.*), found target names {clash[:3]}")
    tensors.update(extra)
    out.mkdir(parents=True)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", file_mode())   # safetensors writes 0600; outputs take the umask
    shutil.copyfile(draft / "config.json", out / "config.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target / f, out / f)
