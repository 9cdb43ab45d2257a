"""Fixtures of the harness tests: the tiny checkpoint source, its prompts, fake loaders."""
from __future__ import annotations

import pytest
import torch

from parity.inputs import encode_prompts, select_prompts
from parity.source import CheckpointSource, resolve_checkpoint

from .fakes import FakeLoaders


@pytest.fixture(scope="session")
def tiny() -> CheckpointSource:
    # One thread: tiny tensors run 5x faster than with two on the shared 2-core CI box (README).
    torch.set_num_threads(1)
    return resolve_checkpoint("tiny", 0)


@pytest.fixture(scope="session")
def chat_prompts(tiny: CheckpointSource):
    return encode_prompts(select_prompts("chat")[:2], tiny.tokenizer, tiny.config.vocab_size)


@pytest.fixture
def fake_loaders(tiny: CheckpointSource) -> FakeLoaders:
    return FakeLoaders(tiny.fingerprint)
