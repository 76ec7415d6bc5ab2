"""Which engine/backend a run gets: "auto" = SGLang + Megatron only when both import on a GPU."""

from __future__ import annotations

import pytest
import torch

from slime_gb10.grpo import registry


def test_cpu_auto_is_the_torch_pair():
    choice = registry.resolve("auto", "auto", torch.device("cpu"))
    assert (choice.rollout, choice.trainer) == ("torch", "torch")
    assert "no CUDA GPU" in choice.reason


def pair(choice):
    return choice.rollout, choice.trainer


def test_explicit_names_are_kept():
    assert pair(registry.resolve("sglang", "torch", torch.device("cpu"))) == ("sglang", "torch")


def test_gpu_auto_needs_both(monkeypatch):
    cuda = torch.device("cuda")
    both = {registry.ENGINE_MODULES["sglang"]: True, registry.BACKEND_MODULES["megatron"]: True}
    monkeypatch.setattr(
        registry, "_importable", lambda m: (both[m], "" if both[m] else "ImportError: missing")
    )
    assert pair(registry.resolve("auto", "auto", cuda)) == ("sglang", "megatron")
    both[registry.BACKEND_MODULES["megatron"]] = False
    choice = registry.resolve("auto", "auto", cuda)
    assert (choice.rollout, choice.trainer) == ("torch", "torch") and "missing" in choice.reason
    # "auto" for one side only fills that side
    assert pair(registry.resolve("auto", "megatron", cuda)) == ("torch", "megatron")


def test_unknown_or_missing_backends_are_clear_errors(monkeypatch):
    with pytest.raises(registry.BackendUnavailableError, match="unknown trainer backend 'jax'"):
        registry.build_backend("jax", None, None, "cpu")

    def no_module(name):
        raise ImportError(f"No module named '{name}'")

    monkeypatch.setattr(registry, "_import", no_module)
    with pytest.raises(registry.BackendUnavailableError, match=r"pip install 'slime-gb10\[sglang\]'"):
        registry.build_engine("sglang", None, None, "cpu")


def test_device_resolution():
    assert registry.resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(registry.BackendUnavailableError, match="no CUDA GPU"):
            registry.resolve_device("cuda")
        assert registry.resolve_device("auto").type == "cpu"
