"""Fixtures shared by the NVFP4 tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="session")
def tiny_llama():
    """A builder of real transformers Llamas, shrunk (the architecture SmolLM2 uses):
    ``tiny_llama(seed, tie_word_embeddings=False, dtype=None)``; a dtype also goes into the config
    (what an export writes as ``torch_dtype``)."""

    def build(seed: int = 0, *, tie_word_embeddings: bool = False, dtype: torch.dtype | None = None):
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=tie_word_embeddings,
            **({"torch_dtype": str(dtype).removeprefix("torch.")} if dtype is not None else {}),
        )
        model = LlamaForCausalLM(config)
        return (model.to(dtype) if dtype is not None else model).eval()

    return build


#: What each family's tiny model needs beyond the common sizes: a few small experts for the MoEs.
TINY_FAMILY_EXTRAS = {
    "Llama": {},
    "Qwen2Moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
    "Qwen3Moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "Mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


@pytest.fixture(scope="session")
def tiny_causal_lm():
    """A builder of one-layer transformers models by family (``"Llama"``, ``"Qwen2Moe"``,
    ``"Qwen3Moe"``, ``"Mixtral"``), random weights: for tests where module names and shapes matter."""
    import transformers

    def build(family: str) -> torch.nn.Module:
        config = getattr(transformers, f"{family}Config")(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            **TINY_FAMILY_EXTRAS[family],
        )
        torch.manual_seed(0)
        return getattr(transformers, f"{family}ForCausalLM")(config).eval()

    return build
