"""Run outputs: ``metrics.jsonl`` (one line per step), ``samples.jsonl``, optional TensorBoard / W&B.

Both JSONL files are append-only and flushed + fsynced after every line, so a crash loses at
most the line being written. On ``--resume`` the lines of steps after the checkpoint are
dropped (the file is rewritten atomically), so the file always describes one consistent run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from slime_gb10.utils.atomic import atomic_write_text, ensure_writable_dir
from slime_gb10.utils.errors import UserError

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"


class ReporterUnavailableError(UserError, RuntimeError):
    pass


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/Inf
    return value


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    p = Path(path)
    if not p.is_file():
        return rows
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return rows


def truncate_after(path: str | Path, step: int) -> None:
    """Keep only the rows with ``step <= step`` (atomic rewrite)."""
    p = Path(path)
    if not p.is_file():
        return
    kept = [row for row in read_jsonl(p) if int(row.get("step", 0)) <= step]
    atomic_write_text(p, "".join(json.dumps(row) + "\n" for row in kept))


class JsonlWriter:
    """Appends JSON lines to ``path`` (its directory exists: :meth:`RunLogger.open` made it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - long-lived

    def write(self, row: dict) -> None:
        self._fh.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def require_reporter(report_to: str) -> None:
    """Fail fast (before any model is loaded) when the chosen reporter's package is missing."""
    import importlib.util

    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(report_to)
    if package and importlib.util.find_spec(package) is None:
        raise ReporterUnavailableError(
            f"--report-to {report_to} needs the '{package}' package: pip install 'slime-gb10[{package}]'"
        )


class RunLogger:
    """config.yaml + metrics.jsonl + samples.jsonl + an optional TensorBoard / W&B reporter."""

    @classmethod
    def open(cls, run_dir: str | Path, config) -> RunLogger:
        """A run's outputs (GRPO or SFT): the directory checked writable, ``config.yaml`` written
        atomically (what ``--resume`` reads back), then the logs. ``config``: a ``GRPOConfig``."""
        run_dir = ensure_writable_dir(run_dir)
        atomic_write_text(run_dir / "config.yaml", config.to_yaml())
        return cls(run_dir, config.output.report_to, config.model_dump(mode="json"))

    def __init__(self, run_dir: str | Path, report_to: str = "none", config: dict | None = None):
        self.run_dir = Path(run_dir)  # an existing, writable directory (:meth:`open`)
        self.metrics = JsonlWriter(self.run_dir / METRICS_FILE)
        self.samples = JsonlWriter(self.run_dir / SAMPLES_FILE)
        self._tb = None
        self._wandb = None
        if report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ReporterUnavailableError(
                    "--report-to tensorboard needs the 'tensorboard' package: pip install 'slime-gb10[tensorboard]'"
                ) from exc
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        elif report_to == "wandb":
            try:
                import wandb
            except ImportError as exc:
                raise ReporterUnavailableError(
                    "--report-to wandb needs the 'wandb' package: pip install 'slime-gb10[wandb]'"
                ) from exc
            self._wandb = wandb.init(project="slime-gb10", dir=str(self.run_dir), config=config or {})

    def log_step(self, row: dict) -> None:
        self.metrics.write(row)
        step = int(row["step"])
        scalars = {
            k: v for k, v in row.items() if isinstance(v, int | float) and k != "step" and math.isfinite(v)
        }
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def log_samples(self, rows: list[dict]) -> None:
        for row in rows:
            self.samples.write(row)

    def close(self) -> None:
        self.metrics.close()
        self.samples.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


MISMATCH_KEYS = (
    "mismatch_k1",
    "mismatch_k3",
    "mismatch_exp_abs",
    "mismatch_exp_abs_median",
    "mis_masked_frac",
)


def step_row(
    step: int,
    ranks: list[dict],
    *,
    pass_threshold: float,
    lr: float,
    grad_norm: float,
    engine_stats: dict[str, float],
    backend_stats: dict[str, float] | None = None,
) -> dict:
    """The ``metrics.jsonl`` row of one GRPO step from each rank's part (one part on one rank).

    A part holds its samples' task ``rewards`` (and optionally ``shaped_rewards``, what the
    advantages were computed from), completion ``lengths``, ``truncated`` flags, per-group
    ``zero_variance`` flags, ``reward_errors``, the backend's ``train_metrics`` (empty if the rank
    trained nothing), ``train_tokens``, its share of the ``loss`` (already divided by the global
    count, so the shares add up) and its phase ``times`` in seconds (the slowest rank's count).
    """
    rewards = [r for part in ranks for r in part["rewards"]]
    shaped = [r for part in ranks for r in part.get("shaped_rewards", part["rewards"])]
    lengths = [n for part in ranks for n in part["lengths"]]
    truncated = [t for part in ranks for t in part["truncated"]]
    zero_variance = [z for part in ranks for z in part["zero_variance"]]
    trained = [part["train_metrics"] for part in ranks if part["train_metrics"]]

    def train_metric(key: str, default: float = math.nan) -> float:
        values = [m[key] for m in trained if key in m]
        return sum(values) / len(values) if values else default

    def slowest(phase: str) -> float:
        return max(part["times"][phase] for part in ranks)

    n = len(rewards)
    mean = sum(rewards) / n
    rollout_s, train_s = slowest("rollout"), slowest("train")
    train_tokens = sum(part["train_tokens"] for part in ranks)
    return {
        "step": step,
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(n - 1, 1)),
        "pass_rate": sum(r >= pass_threshold for r in rewards) / n,
        "response_len_mean": sum(lengths) / n,
        "truncated_frac": sum(truncated) / n,
        "zero_variance_groups": sum(zero_variance) / len(zero_variance),
        # the groups whose rewards differ: the share of the batch that carries a policy gradient
        "signal_groups": 1.0 - sum(zero_variance) / len(zero_variance),
        # what the advantages were computed from (the task reward plus the length remedies)
        "shaped_reward_mean": sum(shaped) / n,
        **{key: train_metric(key) for key in ("entropy", "kl", "clip_frac", "ratio_mean", "tis_weight_mean")},
        "tis_clipped_frac": train_metric("tis_clipped_frac"),  # the share of tokens the TIS cap cut
        # how far the trainer's probabilities are from the rollout engine's (algo.rollout_mismatch)
        **{key: train_metric(key) for key in MISMATCH_KEYS},
        "loss": sum(part["loss"] for part in ranks),
        "grad_norm": grad_norm,
        "lr": train_metric("lr", lr),
        "reward_errors": sum(part["reward_errors"] for part in ranks),
        "rollout_time_s": rollout_s,
        "train_time_s": train_s,
        "sync_time_s": slowest("sync"),
        "rollout_tokens_per_s": sum(lengths) / rollout_s if rollout_s > 0 else math.nan,
        "train_tokens_per_s": train_tokens / train_s if train_s > 0 and train_tokens else math.nan,
        "step_time_s": slowest("step"),
        **{f"rollout/{key}": value for key, value in engine_stats.items()},
        **{f"train/{key}": value for key, value in (backend_stats or {}).items()},
    }


def progress_fields(row: dict) -> dict[str, str]:
    """The progress line's fields of a step's row: reward, response length, the share truncated at
    the cap, the share of groups with a signal, seconds."""
    return {
        "reward": f"{row['reward_mean']:.3f}",
        "len": f"{row['response_len_mean']:.0f}",
        "trunc": f"{row['truncated_frac']:.2f}",
        "signal": f"{row['signal_groups']:.2f}",
        "s": f"{row['step_time_s']:.1f}",
    }


class NullLogger:
    """What ranks other than 0 log to: nothing (rank 0 writes the run's files)."""

    def log_step(self, row: dict) -> None:
        pass

    def log_samples(self, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


def eval_summary(row: dict) -> str:
    """``pass@1 0.406, pass@4 0.781, response_len_mean 36.2`` from a row's ``eval/`` keys."""
    shown = {
        k.removeprefix("eval/"): v
        for k, v in row.items()
        if k.startswith("eval/") and k != "eval/num_prompts"
    }
    n = row.get("eval/num_prompts")
    where = f" on {int(n)} held-out prompts" if n else ""
    return (
        ", ".join(f"{k} {v:.3g}" for k, v in shown.items()) + where + f" ({row.get('eval_time_s', 0):.0f} s)"
    )


def step_mfu(
    device,
    n_params: int | None,
    *,
    prompt_tokens: int,
    rollout_tokens: int,
    train_tokens: int,
    seconds: float,
) -> float | None:
    """A step's model FLOPs utilisation on a CUDA ``device``: 2N per generated or prefilled token, 6N
    per trained token (Kaplan et al. 2020), against the GPU's BF16 peak; None on a CPU, without a
    parameter count, or for a GPU whose peak is not known."""
    if device is None or device.type != "cuda" or seconds <= 0 or not n_params:
        return None
    try:
        from slime_gb10.platform.devices import device_peaks, mfu

        flops = 2 * n_params * (prompt_tokens + rollout_tokens) + 6 * n_params * train_tokens
        return float(mfu(flops / seconds, device_peaks(device.index or 0), precision="bf16"))
    except Exception:  # platform helpers missing or no peak known for this GPU
        return None


def sample_rows(
    step: int, generations, rewards, truths, tokenizer, group_size: int, count: int
) -> list[dict]:
    """``samples.jsonl`` rows of one step: the first completion of each of the first ``count``
    groups, with its prompt as the model saw it (special tokens kept)."""
    return [
        {
            "step": step,
            "prompt": tokenizer.decode(g.prompt_ids, skip_special_tokens=False),
            "completion": g.text,
            "reward": rewards[i],
            "ground_truth": truths[i],
            "finish_reason": g.finish_reason,
        }
        for i, g in list(enumerate(generations))[:: max(1, group_size)][:count]
    ]
