"""One atomic text writer for every output (records, reports, caches, fingerprints).

Temporary file + fsync + rename: a reader never sees half a file, a kill leaves the old file.
The result gets the user's umask (mkstemp alone makes it 0600). Temporary files a killed run left
beside the same target are removed on the next write.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

_STALE_SECONDS = 60.0   # a temp file this old is not a concurrent writer's


def file_mode() -> int:
    """The mode a new file gets under the user's umask (0o666 & ~umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _clean_stale(path: Path) -> None:
    now = time.time()
    for old in path.parent.glob(f".{path.name}.*"):
        try:
            if now - old.stat().st_mtime > _STALE_SECONDS:
                old.unlink()
        except OSError:
            pass


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
