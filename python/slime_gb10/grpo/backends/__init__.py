"""Policy backends: ``torch_backend`` (portable reference), ``megatron_backend`` (GB10 production)."""
