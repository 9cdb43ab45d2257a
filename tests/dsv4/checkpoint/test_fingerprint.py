"""Fingerprints cover tensor data: an in-place rewrite with the same shapes changes them; digests are
cached per file version; outputs get the user's umask and killed runs' temp files are cleaned."""
from __future__ import annotations

import json
import os
import shutil
import time

from safetensors.torch import load_file, save_file

from dsv4.atomic_io import atomic_write_text
from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.fingerprint import SIDECAR
from dsv4.checkpoint.synth import resolve_preset


def test_same_shape_rewrite_changes_the_fingerprint(tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(resolve_preset("tiny"), ck)
    a = open_checkpoint(ck).fingerprint()
    assert (ck / SIDECAR).exists() and open_checkpoint(ck).fingerprint() == a   # cached, stable
    t = load_file(str(ck / "model.safetensors"))
    t["layers.2.ffn.experts.3.w2.weight_scale"] = t["layers.2.ffn.experts.3.w2.weight_scale"].flip(0)
    save_file(t, str(ck / "model.safetensors"), metadata={"format": "pt"})
    assert open_checkpoint(ck).fingerprint() != a


def test_a_corrupt_digest_cache_is_recomputed(tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(resolve_preset("tiny"), ck)
    a = open_checkpoint(ck).fingerprint()
    (ck / SIDECAR).write_text("{not json")
    assert open_checkpoint(ck).fingerprint() == a
    table = json.loads((ck / SIDECAR).read_text())      # rewritten whole
    assert set(table) == {"model.safetensors"} and len(table["model.safetensors"]["sha256"]) == 64


def test_atomic_writes_follow_the_umask_and_clean_stale_temps(tmp_path):
    stale = tmp_path / ".out.json.abc123"
    stale.write_text("half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "out.json", "{}")
    finally:
        os.umask(mask)
    assert (tmp_path / "out.json").stat().st_mode & 0o777 == 0o644
    assert not stale.exists()
