"""SGLang rollout engine end to end on a GPU that can run SGLang (a GB10 inside ``nix develop``).

Not runnable on the project's H100 device (SGLang's wheels and kernels are not on it) nor on a
CPU; it skips there with the reason from ``sglang_engine.availability()``. On a GB10::

    nix develop -c pytest -m gpu tests/grpo/test_sglang_gpu.py -v

What it checks, with a tiny random-init Llama (SmolLM2's tokenizer, real architecture):
SGLang starts with the GB10 settings; after a weight update from the trainer its per-token
logprobs agree with the trainer's on the tokens it sampled (the truncated-importance-sampling
premise); sleep -> update -> wake works and changes what it generates; one GRPO step runs through
the real trainer with ``rollout: sglang``.
"""

from __future__ import annotations

import importlib.util
import statistics

import pytest
import torch

pytestmark = pytest.mark.gpu


def _sglang_ready() -> tuple[bool, str]:
    if importlib.util.find_spec("sglang") is None:
        return False, "sglang is not installed"
    from slime_gb10.grpo.engines.sglang_engine import availability

    return availability()


@pytest.fixture(scope="module")
def sglang_ok():
    ok, reason = _sglang_ready()
    if not ok:
        pytest.skip(f"SGLang cannot run here: {reason}")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, sglang_ok):
    from slime_gb10.grpo.models import default_tokenizer_dir, load_tokenizer, write_random_model

    tokenizer = load_tokenizer(str(default_tokenizer_dir()))
    return write_random_model(
        tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0, initializer_range=0.3
    )


def _config(model_dir, out, **extra):
    from slime_gb10.grpo.config import build_config

    overrides = {
        "model.name_or_path": str(model_dir),
        "output.dir": str(out),
        "backends.rollout": "sglang",
        "backends.trainer": "torch",
        "backends.device": "cuda",
        "data.eval_size": 0,
        "rollout.prompts_per_step": 4,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 16,
        "train.steps": 1,
        "eval.every": 0,
        "output.checkpoint_every": 0,
        "output.progress": False,
        "output.save_final_model": False,
        "sglang.mem_fraction_static": 0.3,  # leave room for the trainer in the same process
    }
    overrides.update(extra)
    return build_config(overrides=overrides)


@pytest.fixture(scope="module")
def engine_and_backend(tiny_model_dir, tmp_path_factory):
    from slime_gb10.grpo.backends.torch_backend import build_backend
    from slime_gb10.grpo.engines.sglang_engine import build_engine
    from slime_gb10.grpo.models import load_tokenizer

    config = _config(tiny_model_dir, tmp_path_factory.mktemp("run"))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    backend = build_backend(config, tokenizer, torch.device("cuda"))
    engine = build_engine(config, tokenizer, torch.device("cuda"))
    engine.update_weights(backend.export_weights(64 << 20))
    yield engine, backend, tokenizer
    engine.shutdown()


def _prompts(tokenizer):
    texts = ["What is 12 + 7?", "Name a colour.", "Count to three.", "Say hello."]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_one_grpo_step_through_sglang(tiny_model_dir, tmp_path, sglang_ok):
    # First in the file: its engine is shut down before the module-scoped one below starts.
    from slime_gb10.grpo.trainer import GRPOTrainer

    trainer = GRPOTrainer(_config(tiny_model_dir, tmp_path / "grpo", **{"backends.trainer": "auto"}))
    try:
        trainer.setup()
        history = trainer.train()
    finally:
        trainer.close()
    row = history[0]
    assert type(trainer.engine).__name__ == "SGLangRolloutEngine"
    for key in ("reward_mean", "loss", "grad_norm", "step_time_s", "rollout_tokens_per_s"):
        assert row[key] == row[key], key  # not NaN


def test_generations_carry_one_logprob_per_token_and_match_the_trainer(engine_and_backend):
    from slime_gb10.grpo.batching import Sample, collate
    from slime_gb10.grpo.interfaces import SamplingParams

    engine, backend, tokenizer = engine_and_backend
    engine.health_check()
    gens = engine.generate(
        _prompts(tokenizer) * 2, SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    )
    assert len(gens) == 8
    for g in gens:
        assert len(g.completion_ids) == len(g.completion_logprobs) > 0
        assert all(lp <= 0.0 for lp in g.completion_logprobs)
        assert g.finish_reason in ("stop", "length")
    samples = [
        Sample(g.prompt_ids, g.completion_ids, g.completion_logprobs, 0.0, 0.0, g.truncated) for g in gens
    ]
    batch, extras = collate(samples, tokenizer.pad_token_id)
    trainer_lp, _ = backend.logprobs(batch)
    mask = batch.completion_mask.bool()
    diff = (trainer_lp.cpu()[mask] - extras["rollout_logprobs"][mask]).abs()
    print(
        f"|SGLang - trainer| logprob: mean {diff.mean():.4f}, max {diff.max():.4f} over {int(mask.sum())} tokens"
    )
    assert diff.mean() < 0.05, diff.mean()  # BF16 engine vs BF16-autocast trainer, same weights


def test_sleep_update_wake_cycle_changes_the_policy(engine_and_backend):
    from slime_gb10.grpo.interfaces import SamplingParams

    engine, backend, tokenizer = engine_and_backend
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate(_prompts(tokenizer), params)
    engine.sleep()
    with torch.no_grad():  # a different policy: scale the embeddings
        for name, p in backend.model.named_parameters():
            if "embed_tokens" in name:
                p.mul_(-1.0)
    engine.update_weights(backend.export_weights(1 << 20))  # small buckets: several update calls
    engine.wake()
    engine.health_check()
    after = engine.generate(_prompts(tokenizer), params)
    assert [g.completion_ids for g in after] != [g.completion_ids for g in before]
    with torch.no_grad():
        for name, p in backend.model.named_parameters():
            if "embed_tokens" in name:
                p.mul_(-1.0)
    engine.update_weights(backend.export_weights(64 << 20))
    again = engine.generate(_prompts(tokenizer), params)
    assert (
        statistics.fmean(float(a.completion_ids == b.completion_ids) for a, b in zip(again, before)) >= 0.75
    )  # greedy decoding with the original weights again (BF16 ties may flip one)
