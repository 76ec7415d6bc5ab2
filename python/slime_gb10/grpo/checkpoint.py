"""Checkpoints of a GRPO run: ``<run>/checkpoints/step-000010/`` written atomically.

Each checkpoint directory holds ``policy.pt`` (model + optimizer + scheduler, from
``PolicyBackend.state_dict``), ``trainer.pt`` (step, data position, RNG states of python /
numpy / torch) and ``meta.json``. The directory is built under a temporary name and renamed into
place (:func:`slime_gb10.utils.atomic.atomic_directory`), so a crash never leaves a half-written
checkpoint, and the newest complete one is what ``--resume`` finds.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slime_gb10.utils.atomic import atomic_directory

CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found or read; the message names the path."""


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (those with meta.json), oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / "meta.json").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    policy_state: dict,
    trainer_state: dict,
    *,
    keep: int = 2,
    reason: str = "periodic",
) -> Path:
    """Write checkpoint ``step`` atomically, then delete the oldest beyond ``keep``."""
    target = checkpoint_path(run_dir, step)
    with atomic_directory(target) as tmp:
        torch.save(policy_state, tmp / "policy.pt")
        torch.save(trainer_state, tmp / "trainer.pt")
        (tmp / "meta.json").write_text(
            json.dumps({"step": step, "reason": reason, "time": time.time()}, indent=1), encoding="utf-8"
        )
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(path: str | Path) -> tuple[dict, dict]:
    """(policy_state, trainer_state) of one checkpoint directory."""
    p = Path(path)
    if not (p / "meta.json").is_file():
        raise CheckpointError(f"'{p}' is not a complete checkpoint (no meta.json)")
    try:
        policy = torch.load(p / "policy.pt", map_location="cpu", weights_only=False)
        trainer = torch.load(p / "trainer.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"cannot read checkpoint '{p}': {exc}") from exc
    return policy, trainer
