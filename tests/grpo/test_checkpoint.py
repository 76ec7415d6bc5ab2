"""Checkpoints: atomic, newest complete one wins, pruning keeps the newest, RNG states round-trip."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from slime_gb10.grpo.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_save_load_prune(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"w": torch.full((2,), float(step))}, {"step": step}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    policy, trainer = load_checkpoint(latest_checkpoint(tmp_path))
    assert trainer["step"] == 3 and policy["w"].tolist() == [3.0, 3.0]


def test_incomplete_checkpoint_is_ignored(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, {"step": 1})
    broken = tmp_path / "checkpoints" / "step-000005"
    broken.mkdir()
    (broken / "policy.pt").write_bytes(b"half")  # a crash before meta.json
    assert latest_checkpoint(tmp_path).name == "step-000001"
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(broken)
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, {"step": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path, 2, {"w": Unpicklable()}, {"step": 2})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp left


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(1).item())
    assert a == b
