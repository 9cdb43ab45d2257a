"""Where generated checkpoints live: synthetic presets and the derived layouts of the trained built-ins."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("DSV4_PARITY_CACHE", Path.home() / ".cache" / "dsv4-parity"))
