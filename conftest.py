"""Session fixtures and markers shared by every test package (markers are declared in pyproject.toml)."""
from __future__ import annotations

import os

import pytest
import torch


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--checkpoint", default=None,
                     help="run the parity suite on this checkpoint directory or preset (default: tiny-trained)")


def _cuda_capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cap = _cuda_capability()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    skip_sm90 = pytest.mark.skip(reason=f"needs an sm_90 (Hopper) GPU; found {cap or 'no GPU'}")
    skip_sm100 = pytest.mark.skip(reason=f"needs an sm_100 (Blackwell) GPU; found {cap or 'no GPU'}")
    for item in items:
        if "gpu" in item.keywords and cap is None:
            item.add_marker(skip_gpu)
        if "sm90" in item.keywords and (cap is None or cap[0] != 9):
            item.add_marker(skip_sm90)
        if "sm100" in item.keywords and (cap is None or cap[0] != 10):
            item.add_marker(skip_sm100)


@pytest.fixture(scope="session")
def device() -> str:
    """The best device present: the parity suite runs on whatever is here."""
    return os.environ.get("DSV4_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def checkpoint_arg(request: pytest.FixtureRequest) -> str:
    from dsv4.checkpoint.builtin import DEFAULT_CHECKPOINT

    return request.config.getoption("--checkpoint") or DEFAULT_CHECKPOINT
