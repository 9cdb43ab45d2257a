"""Content fingerprints of checkpoint shards: sha256 of every byte, computed once per file version.

A weight rewritten in place with the same shape must never reuse a cached result, so the
checkpoint fingerprint covers tensor data, not only headers. Hashing a 160 GB checkpoint is a full
read, so each shard's digest is cached, keyed by (size, mtime_ns, inode): beside the checkpoint in
``.dsv4-fingerprints.json`` when that directory is writable, else under
``$DSV4_PARITY_CACHE/fingerprints``. A changed file (new mtime or size) is hashed again.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from ..atomic_io import atomic_write_text

SIDECAR = ".dsv4-fingerprints.json"


def _cache_files(directory: Path) -> list[Path]:
    root = Path(os.environ.get("DSV4_PARITY_CACHE", Path.home() / ".cache" / "dsv4-parity"))
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    return [directory / SIDECAR, root / "fingerprints" / f"{key}.json"]


def _load(files: list[Path]) -> dict:
    for f in files:
        try:
            d = json.loads(f.read_text())
            if isinstance(d, dict):
                return d
        except (OSError, ValueError):
            continue   # missing or corrupt: recomputed, never trusted
    return {}


def _store(files: list[Path], table: dict) -> None:
    blob = json.dumps(table, indent=1, sort_keys=True)
    for f in files:
        try:
            atomic_write_text(f, blob)
            return
        except OSError:
            continue   # read-only beside the checkpoint: the project cache


_CHUNK = 64 << 20


def _digest(path: Path) -> str:
    """sha256 of the file's data extents; holes of a sparse file enter as their length only (reading
    terabytes of holes would cost what reading the weights does). Plain read where the filesystem
    cannot report holes. A line on stderr when it takes a while (a real checkpoint's first open)."""
    h = hashlib.sha256()
    t0, last = time.monotonic(), time.monotonic()
    size = path.stat().st_size
    with path.open("rb") as fh:
        fd, pos = fh.fileno(), 0
        while pos < size:
            data = _seek(fd, pos, "SEEK_DATA", size)
            if data > pos:
                h.update(f"<hole {data - pos}>".encode())
                pos = data
                continue
            end = _seek(fd, pos, "SEEK_HOLE", size)
            os.lseek(fd, pos, os.SEEK_SET)
            while pos < end:
                chunk = os.read(fd, min(_CHUNK, end - pos))
                if not chunk:
                    pos = end
                    break
                h.update(chunk)
                pos += len(chunk)
                if time.monotonic() - last > 10.0:
                    last = time.monotonic()
                    print(f"[{time.strftime('%H:%M:%S')}] fingerprinting {path.name}: {pos / 1e9:.1f} of "
                          f"{size / 1e9:.1f} GB ({last - t0:.0f} s; once per file version)", file=sys.stderr,
                          flush=True)
    return h.hexdigest()


def _seek(fd: int, pos: int, whence: str, size: int) -> int:
    """lseek SEEK_DATA / SEEK_HOLE; where the platform cannot tell, ``pos`` for data (read it all)
    and ``size`` for the hole. ENXIO from SEEK_DATA: only a hole remains."""
    try:
        return os.lseek(fd, pos, getattr(os, whence))
    except AttributeError:
        return pos if whence == "SEEK_DATA" else size
    except OSError as e:
        if whence == "SEEK_DATA":
            return size if e.errno == errno.ENXIO else pos
        return size


def shard_digests(files: list[Path]) -> dict[str, str]:
    """``{shard name: sha256 of its bytes}``, from the cache where the file is unchanged."""
    if not files:
        return {}
    cache_files = _cache_files(files[0].parent)
    table = _load(cache_files)
    out: dict[str, str] = {}
    dirty = False
    for f in files:
        st = f.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = table.get(f.name)
        if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("sha256"), str):
            out[f.name] = hit["sha256"]
            continue
        digest = _digest(f)
        table[f.name] = {"stamp": stamp, "sha256": digest}
        out[f.name] = digest
        dirty = True
    if dirty:
        _store(cache_files, table)
    return out
