"""Policy backends: ``torch_backend`` (portable reference), ``megatron/`` (GB10 production)."""
