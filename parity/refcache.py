"""The reference cache (``--reference-cache DIR``): a reference run stored once per checkpoint,
prompt and profile, so a real checkpoint's reference runs once per prompt set, not once per native
build. Entries are safetensors files (probes in their emitted dtype, logits fp32 — never quantized)
plus a JSON manifest, written atomically (temporary directory renamed into place).

Key: sha256 of (cache format, checkpoint fingerprint, profile, activation dtype, token ids). The
code version is stored in the manifest (not the key): the reference is the oracle and changes rarely;
delete the directory to force a re-run after changing it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
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


def cache_key(fingerprint: str, profile: str, dtype: str, ids: Sequence[int]) -> str:
    blob = json.dumps([CACHE_FORMAT, fingerprint, profile, dtype, list(ids)]).encode()
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
        manifest = json.loads((d / _MANIFEST).read_text())
        tensors = load_file(str(d / _TENSORS))
        streams = tensors.pop(STREAMS_KEY)
        order = manifest["probe_order"]
        self.hits += 1
        return SideOutput({n: tensors[n] for n in order}, streams, {"forward": 0.0, "cached": 1.0})

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
            manifest = {"cache_format": CACHE_FORMAT, "fingerprint": fingerprint, "profile": profile,
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
