"""Run bookkeeping (grpo/metrics.py): the per-step MFU, by hand."""

from __future__ import annotations

import pytest
import torch

from slime_gb10.grpo.metrics import step_mfu
from slime_gb10.platform import devices
from slime_gb10.platform.devices import lookup_peaks


def test_a_steps_mfu_counts_2n_per_decoded_token_and_6n_per_trained_token(monkeypatch):
    """The trainer's per-step MFU (grpo.metrics.step_mfu) by hand on an H100's 989 TFLOPS BF16:
    N = 1e9 parameters, 1,000 prompt + 3,000 generated tokens (2N each), 4,000 trained (6N), 1 s."""
    h100 = lookup_peaks("NVIDIA H100 80GB HBM3", (9, 0))
    monkeypatch.setattr(devices, "device_peaks", lambda index=0: h100)  # no GPU here: the table's H100
    counts = {"prompt_tokens": 1000, "rollout_tokens": 3000, "train_tokens": 4000, "seconds": 1.0}
    flops = 2 * 1e9 * (1000 + 3000) + 6 * 1e9 * 4000
    assert step_mfu(torch.device("cuda", 0), 10**9, **counts) == pytest.approx(flops / 989e12)
    assert step_mfu(torch.device("cpu"), 10**9, **counts) is None
    assert step_mfu(torch.device("cuda", 0), None, **counts) is None
    assert step_mfu(torch.device("cuda", 0), 10**9, **{**counts, "seconds": 0.0}) is None
