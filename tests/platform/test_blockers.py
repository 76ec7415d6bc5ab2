"""GB10 blockers that a CPU can check in whatever environment runs the tests (CI's venv, the
flake's `cpu-pytest` sandbox): the packages installed together must work together."""

from __future__ import annotations

import pytest


def test_omegaconf_parses_interpolations_with_the_installed_antlr4():
    """Blocker 13: omegaconf built for one ANTLR runtime and run with another fails on the first
    interpolation ("Could not deserialize ATN"). In the Nix closure omegaconf comes in through
    nvidia-modelopt."""
    omegaconf = pytest.importorskip("omegaconf", reason="omegaconf is not installed here")
    cfg = omegaconf.OmegaConf.create({"a": 3, "b": "${a}", "c": "x-${b}"})
    assert cfg.b == 3 and cfg.c == "x-3"
