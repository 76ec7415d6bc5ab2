"""Rollout engines: ``torch_engine`` (portable reference), ``sglang_engine`` (GB10 production)."""
