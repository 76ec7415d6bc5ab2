"""``slime-gb10 plot``: a PNG from metrics.jsonl; clear errors otherwise."""

from __future__ import annotations

import json

import pytest

from slime_gb10.grpo.plot import PlotError, plot_run

pytest.importorskip("matplotlib")


def test_plot_writes_a_png(tmp_path):
    rows = [
        {
            "step": s,
            "reward_mean": s / 10,
            "response_len_mean": 30 - s,
            "entropy": 1.0,
            "kl": None,
            "pass_rate": 0.1,
        }
        for s in range(1, 6)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "rew')
    out = plot_run(tmp_path)
    assert out == tmp_path / "curves.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_errors(tmp_path):
    with pytest.raises(PlotError, match=r"no metrics\.jsonl"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(PlotError, match="no steps"):
        plot_run(tmp_path)


def test_panels_one_reward_line_gaps_at_untrained_steps_eval_point_to_point():
    import math

    from slime_gb10.grpo.plot import plot_panels

    rows = [
        {"step": 0, "eval/pass@1": 0.4, "eval/num_prompts": 32},
        {"step": 1, "reward_mean": 0.25, "pass_rate": 0.25, "grad_norm": 1.5, "entropy": 0.9},
        # every group had zero variance: nothing trained, no grad norm / entropy (null in the JSON)
        {"step": 2, "reward_mean": 1.0, "pass_rate": 1.0, "grad_norm": None, "entropy": None},
        {
            "step": 3,
            "reward_mean": 0.5,
            "pass_rate": 0.5,
            "grad_norm": 0.5,
            "entropy": 0.7,
            "eval/pass@1": 0.9,
        },
    ]
    panels = dict(plot_panels(rows))
    reward = panels["reward (mean) and pass rate"]
    assert [key for key, _ in reward] == ["reward_mean"]  # pass rate == reward: one line, not two
    ((_, grad),) = panels["gradient norm"]
    assert [x for x, _ in grad] == [1, 2, 3] and math.isnan(grad[1][1])  # a gap, not 0.0
    assert grad[0][1] == 1.5 and grad[2][1] == 0.5
    ((_, evals),) = panels["eval pass@1 (greedy)"]
    assert evals == [(0, 0.4), (3, 0.9)]
    rows[1]["pass_rate"] = 0.0  # a reward that is not 0/1: both lines
    assert [key for key, _ in dict(plot_panels(rows))["reward (mean) and pass rate"]] == [
        "reward_mean",
        "pass_rate",
    ]
