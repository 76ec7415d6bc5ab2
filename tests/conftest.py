"""Shared pytest setup: the ``gpu`` marker skips cleanly on machines without CUDA."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(
        reason="needs a CUDA GPU (none here); runs on the device / in the flake's GPU checks"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
