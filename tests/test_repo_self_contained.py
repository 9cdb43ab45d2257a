"""The repository stands alone in a clone: nothing in it points at files outside it."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_file_cites_paths_outside_the_repo() -> None:
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    needle = "../" + "shared"     # split so this file does not match itself
    hits = [f for f in files if (ROOT / f).is_file() and f.endswith((".py", ".md", ".toml", ".html", ".txt", ".sh"))
            and needle in (ROOT / f).read_text(encoding="utf-8", errors="replace")]
    assert not hits, f"files citing {needle}: {hits}"
