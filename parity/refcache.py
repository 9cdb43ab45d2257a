"""The reference cache (``--reference-cache DIR``): a reference run stored once per checkpoint,
prompt and profile, so a real checkpoint's reference runs once per prompt set, not once per native
build. Entries are safetensors files (probes in their emitted dtype, logits fp32 — never quantized)
plus a JSON manifest, written atomically (temporary directory renamed into place).

Key: sha256 of (cache format, checkpoint fingerprint — config, headers and tensor data —, the
digest of the reference's own source and of what it reads through, profile, activation dtype, token
ids): a changed weight or a changed oracle never reuses an entry. A corrupt entry (unreadable
manifest or tensors, a manifest that is not this key's) is reported on stderr, removed and recomputed.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file

from .env import code_version
from .runner import STREAMS_KEY, SideOutput

CACHE_FORMAT = 1
_TENSORS = "probes.safetensors"
_MANIFEST = "manifest.json"


@functools.lru_cache(maxsize=1)
def reference_code_digest() -> str:
    """sha256 of the oracle's source: reference/, and the dsv4 modules it may import (config,
    checkpoint reading, probes, encoding, tokenizer)."""
    import dsv4
    import reference

    roots = [Path(reference.__file__).parent, Path(dsv4.__file__).parent / "checkpoint"]
    files = sorted(f for r in roots for f in r.glob("*.py"))
    files += [Path(dsv4.__file__).parent / n for n in ("config.py", "config_keys.py", "probes.py", "encoding.py",
                                                        "tokenizer.py")]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(fingerprint: str, profile: str, dtype: str, ids: Sequence[int]) -> str:
    blob = json.dumps([CACHE_FORMAT, fingerprint, reference_code_digest(), profile, dtype, list(ids)]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


class ReferenceCache:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def _dir(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> SideOutput | None:
        d = self._dir(key)
        if not (d / _MANIFEST).exists():
            self.misses += 1
            return None
        try:
            manifest = json.loads((d / _MANIFEST).read_text())
            if manifest.get("key", key) != key:
                raise ValueError(f"manifest of key {manifest.get('key')!r}")
            tensors = load_file(str(d / _TENSORS))
            streams = tensors.pop(STREAMS_KEY)
            probes = {n: tensors[n] for n in manifest["probe_order"]}
        except Exception as e:   # any unreadable entry (JSON, safetensors, missing probe): recompute
            print(f"reference cache: entry {d} is corrupt ({type(e).__name__}: {e}); removed, recomputing",
                  file=sys.stderr)
            shutil.rmtree(d, ignore_errors=True)
            self.misses += 1
            return None
        self.hits += 1
        return SideOutput(probes, streams, {"forward": 0.0, "cached": 1.0})

    def store(self, key: str, out: SideOutput, *, prompt_id: str, fingerprint: str, profile: str,
              ids: Sequence[int]) -> None:
        final = self._dir(key)
        if (final / _MANIFEST).exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        try:
            tensors = {n: t.detach().to("cpu").contiguous() for n, t in out.probes.items()}
            tensors[STREAMS_KEY] = out.streams.contiguous()
            save_file(tensors, str(tmp / _TENSORS))
            manifest = {"cache_format": CACHE_FORMAT, "key": key, "fingerprint": fingerprint, "profile": profile,
                        "prompt_id": prompt_id, "token_ids": list(ids), "probe_order": list(out.probes),
                        "code_version": code_version(), "forward_seconds": out.seconds.get("forward")}
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / _MANIFEST).exists():   # not a lost race with a parallel writer
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
