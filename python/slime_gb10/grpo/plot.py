"""A finished run, shown: ``slime-gb10 plot RUN_DIR`` (the curves of its ``metrics.jsonl`` as one PNG) and
the closing lines of ``slime-gb10 train`` (:func:`run_summary`)."""

from __future__ import annotations

import math
from pathlib import Path

from slime_gb10.grpo.metrics import METRICS_FILE, read_jsonl
from slime_gb10.utils.atomic import atomic_open
from slime_gb10.utils.errors import UserError

# (metric keys, panel title): a panel is skipped when the run has no finite value for any of its keys.
# Per-step training metrics are drawn with gaps at steps that have no value (a step whose groups
# all had zero variance trains nothing: no loss, gradient norm or entropy); eval metrics, logged
# every eval.every steps, are drawn point to point.
PANELS = [
    (("reward_mean", "pass_rate"), "reward (mean) and pass rate"),
    (("response_len_mean",), "response length (tokens)"),
    (("truncated_frac", "signal_groups"), "truncated at the cap; groups with signal"),
    (("entropy",), "entropy (nats/token)"),
    (("kl",), "KL(policy || reference)"),
    (("clip_frac",), "clip fraction"),
    (("grad_norm",), "gradient norm"),
    (("zero_variance_groups",), "groups with zero reward variance"),
    (("eval/pass@1",), "eval pass@1 (greedy)"),
]


def _value(row: dict, key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else math.nan


class PlotError(UserError, RuntimeError):
    pass


def plot_panels(rows: list[dict]) -> list[tuple[str, list[tuple[str, list[tuple[int, float]]]]]]:
    """``[(title, [(key, [(step, value), ...]), ...]), ...]``: what :func:`plot_run` draws.

    Training metrics have a point at every training step, NaN (drawn as a gap, never as 0) where a
    step has no value; eval metrics only where they were measured. A pass-rate line equal to the
    reward line (0/1 rewards) is left out.
    """
    train_rows = [row for row in rows if "reward_mean" in row]  # step rows (not the step-0 eval row)
    panels = []
    for keys, title in PANELS:
        lines = []
        for key in keys:
            if key.startswith("eval/"):  # point to point
                points = [(row["step"], _value(row, key)) for row in rows]
                points = [(x, y) for x, y in points if math.isfinite(y)]
            else:  # every training step, NaN (a gap) where there is no value
                points = [(row["step"], _value(row, key)) for row in train_rows]
            if any(math.isfinite(y) for _, y in points):
                lines.append((key, points))
        if len(lines) == 2 and [y for _, y in lines[0][1]] == [y for _, y in lines[1][1]]:
            lines = lines[:1]
        if lines:
            panels.append((title, lines))
    return panels


def plot_run(run_dir: str | Path, out_file: str | Path | None = None) -> Path:
    run = Path(run_dir)
    metrics_path = run / METRICS_FILE
    if not metrics_path.is_file():
        raise PlotError(f"no {METRICS_FILE} in '{run}': pass the --output directory of a training run")
    rows = read_jsonl(metrics_path)
    if not rows:
        raise PlotError(f"'{metrics_path}' holds no steps yet")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError("plotting needs matplotlib: pip install 'slime-gb10[plot]'") from exc

    from matplotlib.ticker import MaxNLocator

    panels = plot_panels(rows)
    cols = 2
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(10, 3 * nrows), squeeze=False)
    for ax, (title, lines) in zip(axes.flat, panels):
        for key, points in lines:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, linewidth=1.5, label=key)
        if len(lines) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(str(run))
    fig.tight_layout()
    out = Path(out_file) if out_file else run / "curves.png"
    with atomic_open(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=100)
    plt.close(fig)
    return out


def run_summary(history: list[dict], run_dir: Path) -> str:
    """The closing lines of ``slime-gb10 train``: reward and held-out pass@1 first -> last (from
    ``metrics.jsonl``, which holds a resumed run's earlier evals too), ``curves.png``, the outputs."""
    if not history:
        return f"nothing to do: the run in {run_dir} is already at train.steps (raise --steps to go on)"
    n = min(3, len(history))
    first = sum(r["reward_mean"] for r in history[:n]) / n
    last = sum(r["reward_mean"] for r in history[-n:]) / n
    lines = [
        f"done: {len(history)} steps; mean reward of the first {n} steps {first:.3f} -> last {n} {last:.3f}"
    ]
    evals = [r for r in read_jsonl(run_dir / METRICS_FILE) if "eval/pass@1" in r]
    if len(evals) >= 2:
        a, b = evals[0], evals[-1]
        count = int(b.get("eval/num_prompts", 0))
        lines.append(
            f"held-out pass@1 (greedy, {count} prompts): step {a['step']} {a['eval/pass@1']:.3f} -> "
            f"step {b['step']} {b['eval/pass@1']:.3f}"
        )
    try:
        lines.append(f"curves: {plot_run(run_dir)}")
    except PlotError as exc:
        lines.append(f"curves: not drawn ({exc})")
    lines.append(f"outputs in {run_dir}")
    return "\n".join(lines)
