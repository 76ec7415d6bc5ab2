"""The top-level CLI: help is instant, bad options give a clear message and no traceback."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from slime_gb10.cli import SUBCOMMANDS, main


def test_help_lists_every_subcommand():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert name in result.output


def test_unknown_option_is_a_clear_error_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "slime_gb10.cli", "--no-such-option"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "No such option" in proc.stderr and "--no-such-option" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_subcommand_is_a_clear_error():
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.output
