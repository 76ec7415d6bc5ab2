"""The embedded model's cache: a directory with a config and a tokenizer but no weights is not a
converted model (found when a tokenizer-only cache on the GPU machine made `eval` fail with "no file
named model.safetensors")."""

from __future__ import annotations

import json

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
