"""The pure-PyTorch BF16 DeepSeek-V4 reference: the oracle of the project (spec §3-§12, §16).

It imports only compute-free parts of ``dsv4`` (config, checkpoint, probes, encoding/tokenizer);
never ``dsv4.layers``, ``dsv4.numerics``, ``dsv4.kernels`` or ``dsv4.model`` (design principle 2).
"""
from __future__ import annotations

from .model import ReferenceModel, load_model
from .profiles import PROFILES, Profile, get_profile
from .state import ReferenceState

__all__ = ["load_model", "ReferenceModel", "ReferenceState", "Profile", "PROFILES", "get_profile"]
