"""A random-init model of Qwen2.5-0.5B's architecture (hidden 896, 24 layers, 14/2 heads, MLP 4864,
tied embeddings, vocab 151,936) with SmolLM2's tokenizer, for timing the GB10 recipe's shape: every
completion of a random model runs to the token limit, so the work per step is fixed (the worst case)."""

import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

out, tokenizer_dir = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
config = Qwen2Config(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
    rope_theta=1_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6, torch_dtype="bfloat16",
)  # fmt: skip
model = Qwen2ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    if (tokenizer_dir / name).is_file():
        shutil.copy(tokenizer_dir / name, out / name)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters -> {out}")
