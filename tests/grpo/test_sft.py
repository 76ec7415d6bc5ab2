"""`slime-gb10 sft`: targets from GSM8K's worked solutions, labels on the solution only, the loss against
a float64 reference, micro-batching that does not change the step, and the command end to end on a
random tiny model with the real tokenizer and real GSM8K lines."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from slime_gb10.cli import main
from slime_gb10.grpo import data, rewards, sft
from slime_gb10.grpo.models import write_random_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0)


@pytest.fixture(scope="module")
def gsm8k_small(tmp_path_factory, gsm8k_dir):
    """The first 12 training and 6 test lines of the real GSM8K files."""
    folder = tmp_path_factory.mktemp("gsm8k-small")
    for name, n in (("train.jsonl", 12), ("test.jsonl", 6)):
        lines = (gsm8k_dir / name).read_text(encoding="utf-8").splitlines()[:n]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def invoke(*args):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def test_the_target_is_the_worked_solution_without_calculator_annotations():
    natalia = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
    )
    assert sft.solution_text(natalia) == (
        "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"
    )
    assert sft.solution_text("So $1,234 in all.\n####  1,234 ") == "So $1,234 in all.\n#### 1234"
    assert sft.solution_text("no marker") == "no marker"


def test_every_target_of_the_real_train_file_earns_the_gsm8k_reward(gsm8k_dir):
    examples = data.load_prompt_dataset(str(gsm8k_dir / "train.jsonl"))
    assert len(examples) == 7473 and all(e.solution for e in examples)
    for e in examples[:500]:
        target = sft.solution_text(e.solution)
        assert "<<" not in target and rewards.gsm8k_reward(target, e.ground_truth) == 1.0, e.id


def test_labels_cover_the_solution_only():
    batch = [sft.Encoded(ids=[1, 2, 3, 4, 5], start=3), sft.Encoded(ids=[7, 8, 9], start=1)]
    input_ids, mask, labels = sft.collate(batch, pad_id=0)
    assert input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert labels.tolist() == [[-100, -100, -100, 4, 5], [-100, 8, 9, -100, -100]]


def test_the_loss_against_a_float64_reference():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.tensor([[-100, -100, -100, 4, 5], [-100, 8, 9, -100, -100]])
    nll, count = sft.solution_nll(logits, labels)
    reference, n = 0.0, 0
    logp = torch.log_softmax(logits.double(), dim=-1)
    for row in range(2):
        for t in range(4):  # position t predicts token t + 1
            if labels[row, t + 1] != -100:
                reference -= float(logp[row, t, labels[row, t + 1]])
                n += 1
    assert count == n == 4 and float(nll) == pytest.approx(reference, rel=1e-5)


def test_step_batches_visit_every_example_once_an_epoch():
    steps = sft.step_batches(10, 4, epochs=2, seed=3)
    assert [len(s) for s in steps] == [4, 4, 2, 4, 4, 2]
    for epoch in (steps[:3], steps[3:]):
        assert sorted(i for batch in epoch for i in batch) == list(range(10))
    assert steps == sft.step_batches(10, 4, epochs=2, seed=3) and steps != sft.step_batches(10, 4, 2, seed=4)


def _run(tmp_path, tiny_dir, gsm8k_small, name, *extra):
    out = tmp_path / name
    args = ["sft", "--model", str(tiny_dir), "--data", str(gsm8k_small / "train.jsonl")]
    args += ["--eval-data", str(gsm8k_small / "test.jsonl"), "--output", str(out), "--device", "cpu"]
    result = invoke(*args, "--no-progress", *extra)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, rows, result.output


def test_sft_end_to_end_writes_a_model_that_train_and_eval_load(tmp_path, tiny_dir, gsm8k_small):
    out, rows, output = _run(
        tmp_path, tiny_dir, gsm8k_small, "run", "--epochs", "3", "--batch-size", "4", "--lr", "1e-3"
    )
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 9 and [r["step"] for r in steps] == list(range(1, 10))
    assert steps[-1]["loss"] < steps[0]["loss"]  # a random model learns the 12 solutions it sees
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 9] and evals[0]["eval/examples"] == 6
    assert math.isfinite(evals[1]["eval/loss"])
    assert "held-out solution loss" in output and (out / "config.yaml").is_file()
    # the model GRPO starts from: an HF directory with the tokenizer
    result = invoke("eval", "--model", str(out / "final_model"), "--data", str(gsm8k_small / "train.jsonl"),
                    "--eval-data", str(gsm8k_small / "test.jsonl"), "--device", "cpu",
                    "--max-new-tokens", "4", "--num-prompts", "all")  # fmt: skip
    assert result.exit_code == 0, result.output
    # ... and GRPO starts from: one CPU step of train with it, from its FP32 weights
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(out / "final_model" / "model.safetensors").values()} == {torch.float32}
    result = invoke("train", "--model", str(out / "final_model"), "--data", str(gsm8k_small / "train.jsonl"),
                    "--set", "data.eval_size=0", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                    "--max-new-tokens", "4", "--device", "cpu", "--output", str(tmp_path / "grpo"),
                    "--no-progress", "--eval-every", "0")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "grpo" / "final_model").is_dir()
    # a run directory is never silently reused
    again = invoke("sft", "--model", str(tiny_dir), "--data", str(gsm8k_small / "train.jsonl"),
                   "--eval-data", str(gsm8k_small / "test.jsonl"), "--output", str(out))  # fmt: skip
    assert again.exit_code != 0 and "already holds a run" in again.output


def test_sft_writes_apart_from_train_by_default(tmp_path, tiny_dir, gsm8k_small, monkeypatch):
    """Without --output, sft writes to the config's output.dir + '-sft': `train --config X --model
    <that>/final_model` must not find its own output directory holding the model it starts from."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("output:\n  dir: runs/x\nsft:\n  batch_size: 4\n  epochs: 1\n")
    result = invoke("sft", "--config", str(config), "--model", str(tiny_dir), "--data", str(gsm8k_small / "train.jsonl"),
                    "--eval-data", str(gsm8k_small / "test.jsonl"), "--device", "cpu", "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "x-sft" / "final_model").is_dir() and not (tmp_path / "runs" / "x").exists()


def test_micro_batches_do_not_change_the_step(tiny_dir):
    """The step's loss is the mean over all its solution tokens: solutions of different lengths at
    once or one by one give the same gradient, equal to that of one independent full-batch mean."""
    from slime_gb10.grpo.models import load_causal_lm

    model = load_causal_lm(str(tiny_dir))
    g = torch.Generator().manual_seed(0)
    batch = [
        sft.Encoded(ids=torch.randint(0, 100, (n,), generator=g).tolist(), start=s)
        for n, s in ((9, 3), (5, 4), (12, 2), (7, 6))
    ]
    grads = []
    for micro in (4, 1, 3):
        model.zero_grad(set_to_none=True)
        loss = sft.accumulate_step(model, batch, micro, pad_id=0, device=torch.device("cpu"), autocast=False)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    # independently: every solution token's NLL, averaged with equal weight per token
    model.zero_grad(set_to_none=True)
    terms = []
    for e in batch:
        logp = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0].float(), dim=-1)
        terms += [-logp[t - 1, e.ids[t]] for t in range(e.start, len(e.ids))]
    reference = torch.stack(terms).mean()
    reference.backward()
    assert len(terms) == 6 + 1 + 10 + 1
    for loss, grad in grads:
        assert loss == pytest.approx(float(reference.detach()), rel=1e-5)
        for got, want in zip(grad, (p.grad for p in model.parameters())):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_data_without_solutions_is_refused_in_one_line(tmp_path, tiny_dir):
    result = invoke("sft", "--model", str(tiny_dir), "--output", str(tmp_path / "x"), "--device", "cpu")
    assert result.exit_code != 0 and "trains on reference solutions" in result.output
    assert not (tmp_path / "x").exists()
    generic = tmp_path / "generic.jsonl"
    generic.write_text(json.dumps({"prompt": "2+2?", "ground_truth": "4"}) + "\n")
    result = invoke("sft", "--model", str(tiny_dir), "--data", str(generic), "--set", "data.eval_size=0",
                    "--output", str(tmp_path / "y"))  # fmt: skip
    assert result.exit_code != 0 and "has none" in result.output
