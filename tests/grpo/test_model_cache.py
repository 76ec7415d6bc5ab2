"""The embedded model's cache: a directory with a config and a tokenizer but no weights is not a
converted model (found when a tokenizer-only cache on the GPU machine made `eval` fail with "no file
named model.safetensors"); an unwritable cache is one line naming it and SLIME_GB10_CACHE (issue #41)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from slime_gb10.cli import main
from slime_gb10.grpo import models


def test_a_cache_without_weights_is_converted_again_and_still_gives_its_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_GB10_CACHE", str(tmp_path))
    target = tmp_path / models.SMOLLM2_CACHE_NAME
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (target / "tokenizer_config.json").write_text("{}")
    converted = []

    # The conversion itself (38 s on this CPU) runs for real in the CLI tests; here only the decision.
    def fake_convert(gguf, where):
        converted.append(where)
        (where / "model.safetensors").write_bytes(b"")
        return where

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    monkeypatch.setattr(models, "find_smollm2_gguf", lambda: tmp_path / "SmolLM2.gguf")
    assert models.default_tokenizer_dir() == target and converted == []  # the tokenizer is there
    assert models.default_model_dir() == target and converted == [target]  # the weights were not
    assert models.default_model_dir() == target and converted == [target]  # now they are: no second run


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    """A directory nothing can be written in: chmod 0o555, or, as root (whom chmod does not stop),
    the cache's write check failing there as a read-only file system would make it."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:

        def probe(directory):
            if ro in (Path(directory), *Path(directory).parents):
                raise PermissionError(errno.EACCES, "Permission denied", str(directory))
            with tempfile.NamedTemporaryFile(dir=directory):
                pass

        monkeypatch.setattr(models, "_probe_write", probe, raising=False)
    else:
        ro.chmod(0o555)
    yield ro
    ro.chmod(0o755)


def test_an_unwritable_cache_is_one_line_naming_it_and_slime_gb10_cache(read_only_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_GB10_CACHE", str(read_only_dir / "cache"))
    monkeypatch.setattr(models, "find_smollm2_gguf", lambda: tmp_path / "SmolLM2.gguf")
    converted = []
    monkeypatch.setattr(models, "_require_gguf_deps", lambda: converted.append(1))
    with pytest.raises(models.ModelLoadError) as info:
        models.default_model_dir()
    message = str(info.value)
    assert f"'{read_only_dir / 'cache'}'" in message and "SLIME_GB10_CACHE=/writable/dir" in message
    assert "\n" not in message and "--output" not in message
    assert converted == []  # refused before the conversion starts


def test_a_read_only_home_through_the_cli_names_the_cache_not_output(read_only_dir, tmp_path, monkeypatch):
    """The report: HOME unwritable, `slime-gb10 eval` with the embedded model said to pass --output."""
    monkeypatch.delenv("SLIME_GB10_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(read_only_dir))
    monkeypatch.setattr(models, "find_smollm2_gguf", lambda: tmp_path / "SmolLM2.gguf")
    result = CliRunner().invoke(main, ["eval", "--device", "cpu", "--num-prompts", "1"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    cache = read_only_dir / ".cache" / "slime-gb10"
    assert f"'{cache}'" in errors[0] and "SLIME_GB10_CACHE=/writable/dir" in errors[0], errors[0]
    assert "--output" not in errors[0]
