"""Config errors: unknown keys list the valid ones, bad values name the key, overrides layer in order."""

from __future__ import annotations

import json

import pytest

from slime_gb10.grpo.config import ConfigError, GRPOConfig, build_config, parse_set_override, valid_keys


def test_defaults_are_the_embedded_run():
    cfg = build_config()
    assert cfg.model.name_or_path is None  # embedded SmolLM2
    assert cfg.data.task == "arithmetic"
    assert cfg.backends.rollout == "auto" and cfg.backends.trainer == "auto"
    assert cfg.sglang.attention_backend == "auto" and cfg.megatron.precision == "bf16"


def test_unknown_nested_key_lists_valid_keys_of_its_section():
    with pytest.raises(ConfigError) as info:
        build_config(sets=["train.lrr=1e-5"])
    msg = str(info.value)
    assert "unknown config key 'train.lrr'" in msg
    assert "train.lr" in msg and "train.steps" in msg
    assert "rollout.group_size" not in msg  # only the section's keys


def test_unknown_top_level_key_lists_all_keys():
    with pytest.raises(ConfigError) as info:
        build_config(sets=["trainer.lr=1"])
    msg = str(info.value)
    assert "unknown config key 'trainer'" in msg
    assert "rollout.group_size" in msg and "megatron.precision" in msg


def test_bad_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"'rollout.group_size'.*greater than or equal to 2"):
        build_config(overrides={"rollout.group_size": 1})  # one sample per prompt: every advantage is 0
    with pytest.raises(ConfigError, match=r"'algo.loss_agg'"):
        build_config(sets=["algo.loss_agg=token-sum"])


def test_file_task_needs_a_path():
    with pytest.raises(ConfigError, match=r"data\.path is not set"):
        build_config(sets=["data.task=file"])


def test_layering_file_then_flags_then_set(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 0.5\n  steps: 7\nrollout:\n  group_size: 3\n")
    cfg = build_config(path, overrides={"train.steps": 9}, sets=["train.steps=11", "algo.tis_cap=null"])
    assert cfg.train.lr == 0.5  # from the file
    assert cfg.rollout.group_size == 3
    assert cfg.train.steps == 11  # --set wins over the flag, which wins over the file
    assert cfg.algo.tis_cap is None  # YAML null


def test_json_file_and_bad_files(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"rollout": {"max_new_tokens": 12}}))
    assert build_config(good).rollout.max_new_tokens == 12
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        build_config(scalar)


def test_set_parsing():
    assert parse_set_override("a.b=1e-3") == (["a", "b"], 1e-3)
    assert parse_set_override("a.b=true") == (["a", "b"], True)
    assert parse_set_override("rollout.stop=['x', 'y']") == (["rollout", "stop"], ["x", "y"])
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_set_override("novalue")


def test_print_config_round_trips(tmp_path):
    cfg = build_config(sets=["train.steps=3"])
    path = tmp_path / "round.yaml"
    path.write_text(cfg.to_yaml())
    assert build_config(path) == cfg
    assert "train.steps" in valid_keys(GRPOConfig)


def _config_fields():
    """``(section.key, field)`` of every setting, walked from the models themselves."""
    for section, section_field in GRPOConfig.model_fields.items():
        for name, field in section_field.annotation.model_fields.items():
            yield f"{section}.{name}", field


def test_every_setting_has_a_description():
    """Each setting is declared once with its help (the --help listing and the flags show it)."""
    fields = list(_config_fields())
    assert len(fields) == len(valid_keys()) >= 80
    missing = [key for key, field in fields if not (field.description or "").strip()]
    assert not missing, f"config fields without description=: {missing}"


def test_train_help_lists_every_setting_with_its_description():
    from click.testing import CliRunner

    from slime_gb10.cli import main

    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0, result.output

    def words(text: str) -> str:  # click wraps lines, and may break after a hyphen
        return " ".join(text.split()).replace("- ", "-")

    help_text = words(result.output)
    assert "Settings (keys of a --config file" in help_text
    for key, field in _config_fields():
        assert f" {key} " in help_text, key
        first_words = " ".join(field.description.split()[:6])
        assert words(f"{key} {first_words}") in help_text, (key, first_words)


def test_greedy_rollouts_are_refused_at_validation_and_eval_temperature_is_its_own():
    """rollout.temperature=0 gives every sample of a group the same completion: zero reward variance
    in every group by construction, so GRPO would never update (issue #41)."""
    for source in ({"sets": ["rollout.temperature=0"]}, {"overrides": {"rollout.temperature": 0.0}}):
        with pytest.raises(ConfigError) as info:
            build_config(**source)
        message = str(info.value)
        assert "rollout.temperature=0" in message and "set rollout.temperature > 0" in message
    assert build_config(sets=["rollout.temperature=0.05"]).rollout.temperature == 0.05
    assert build_config(sets=["eval.temperature=0"]).eval.temperature == 0.0  # greedy eval: fine
