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
