"""README.md's Python snippets run as pasted (each ```python block, in order, in one namespace, in a
fresh working directory), and its two plain-Python commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_python_snippets():
    assert python_blocks(README), "README.md has no ```python block to test"


@pytest.mark.slow
def test_readme_python_snippets_run_as_pasted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for number, block in enumerate(python_blocks(README), 1):
        code = compile(block, f"README.md python block {number}", "exec")
        exec(code, namespace)  # our own README: running it is the point of the test


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    command = "scripts/quickstart.sh test"
    assert command in README and command in ci
    assert "scripts/quickstart.sh train" in README
