"""``slime-gb10 plot RUN_DIR``: the curves of a run's ``metrics.jsonl`` as one PNG."""

from __future__ import annotations

import math
from pathlib import Path

from slime_gb10.grpo.metrics import METRICS_FILE, read_jsonl
from slime_gb10.utils.atomic import atomic_open

# (metric key, panel title); a panel is skipped when the run has no finite value for it
PANELS = [
    ("reward_mean", "reward (mean over samples)"),
    ("pass_rate", "pass rate"),
    ("response_len_mean", "response length (tokens)"),
    ("entropy", "entropy (nats/token)"),
    ("kl", "KL(policy || reference)"),
    ("clip_frac", "clip fraction"),
    ("grad_norm", "gradient norm"),
    ("eval/pass@1", "eval pass@1 (greedy)"),
]


class PlotError(RuntimeError):
    pass


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

    panels = []
    for key, title in PANELS:
        points = [
            (row["step"], row[key])
            for row in rows
            if isinstance(row.get(key), int | float) and math.isfinite(row[key])
        ]
        if points:
            panels.append((title, points))
    cols = 2
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(10, 3 * nrows), squeeze=False)
    for ax, (title, points) in zip(axes.flat, panels):
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, linewidth=1.5)
        ax.set_title(title)
        ax.set_xlabel("step")
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
