"""The training corpus: the CPython standard library's own source, which every machine with Python
has, under the PSF licence. ``corpus.json`` records the exact files (path relative to the stdlib,
size, sha256) and the Python version they came from; a different interpreter's files are refused by
name, so a run is either the recorded one or says why it is not."""
from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).with_name("corpus.json")
HELD_OUT_EVERY = 10   # every 10th file (sorted order) is held out


class CorpusError(ValueError):
    """The interpreter's files are not the recorded corpus; the message names the first difference."""


@dataclass(frozen=True)
class Doc:
    path: str      # relative to the stdlib directory
    sha256: str
    size: int
    held_out: bool


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def select_files(root: Path) -> list[str]:
    """Top-level modules plus the docs' topic texts (pydoc_data/topics.py: English prose)."""
    files = sorted(p.name for p in root.glob("*.py") if p.is_file())
    return files + ["pydoc_data/topics.py"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_manifest(root: Path | None = None) -> dict:
    import platform

    root = root or stdlib_dir()
    docs = []
    for i, rel in enumerate(select_files(root)):
        data = (root / rel).read_bytes()
        docs.append({"path": rel, "size": len(data), "sha256": _sha(data), "held_out": i % HELD_OUT_EVERY == 0})
    return {"source": "CPython standard library (PSF License Version 2)", "python": platform.python_version(),
            "files": docs, "total_bytes": sum(d["size"] for d in docs)}


def load_docs(manifest: dict, root: Path | None = None) -> list[tuple[Doc, str]]:
    """Every recorded file with its text, each checked against its recorded sha256."""
    root = root or stdlib_dir()
    out = []
    for d in manifest["files"]:
        f = root / d["path"]
        if not f.is_file():
            raise CorpusError(f"corpus: expected {f} (Python {manifest['python']}'s stdlib), found no such file")
        data = f.read_bytes()
        if _sha(data) != d["sha256"]:
            raise CorpusError(f"corpus: expected {d['path']} with sha256 {d['sha256'][:16]}… (Python "
                              f"{manifest['python']}), found {_sha(data)[:16]}… — another Python version; run "
                              f"with the recorded one or write a new manifest with --new-corpus")
        out.append((Doc(d["path"], d["sha256"], d["size"], d["held_out"]), data.decode("utf-8")))
    return out


def read_manifest(path: Path | None = None) -> dict:
    return json.loads((path or MANIFEST).read_text())
