"""Fixtures of the reference tests: the built-in tiny checkpoint and models loaded from it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

import reference
from dsv4.checkpoint.synth import resolve_preset


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """The tiny model's ops are microseconds long: on a small shared CPU the intra-op thread pool's
    synchronization dominates (10x slower with 2 threads under load). Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return resolve_preset("tiny", flavor="nvidia-nvfp4", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_path: Path) -> Callable[..., reference.ReferenceModel]:
    """Memoized loader: tiny_model(profile=..., dtype=...). Models are stateless between calls
    (all state lives in ReferenceState), so sharing them across tests is safe."""
    memo: dict[tuple[str, torch.dtype], reference.ReferenceModel] = {}

    def get(profile: str = "bf16", dtype: torch.dtype = torch.float32) -> reference.ReferenceModel:
        key = (profile, dtype)
        if key not in memo:
            memo[key] = reference.load_model(str(tiny_path), profile=profile, dtype=dtype)
        return memo[key]

    return get


@pytest.fixture(scope="session")
def tiny_with(tiny_path: Path) -> Callable[..., reference.ReferenceModel]:
    """tiny_with(profile=..., dtype=..., **config_changes): the tiny checkpoint read under a modified
    config (fields that do not change tensor shapes, e.g. index_topk or swiglu_limit)."""
    from dsv4.checkpoint.reader import open_checkpoint
    from dsv4.config import layer_devices

    def get(profile: str = "bf16", dtype: torch.dtype = torch.float32, **changes: object) -> reference.ReferenceModel:
        reader = open_checkpoint(tiny_path)
        reader = open_checkpoint(tiny_path, config=reader.config.replace(**changes))
        return reference.ReferenceModel(reader, profile=reference.get_profile(profile), dtype=dtype,
                                        devices=layer_devices(reader.config, "cpu", None), cache_weights=True)

    return get


@pytest.fixture(scope="session")
def make_ids() -> Callable[..., torch.Tensor]:
    """make_ids(n, seed=0): n deterministic token ids of the tiny vocabulary."""
    def make(n: int, seed: int = 0, vocab: int = 512) -> torch.Tensor:
        return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))

    return make
