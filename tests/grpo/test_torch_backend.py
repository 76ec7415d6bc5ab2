"""The PyTorch policy backend: chunked logprobs equal a full float64 forward, microbatching equals
one big batch, NaN stops before the optimizer step, and weight sync to the engine is bit-exact.

Real parts: SmolLM2's tokenizer and a small random-init Llama from a real ``transformers`` config.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from slime_gb10.grpo.backends.torch_backend import NonFiniteError, TorchPolicyBackend
from slime_gb10.grpo.batching import Sample, collate, right_padded
from slime_gb10.grpo.engines.torch.engine import TorchRolloutEngine
from slime_gb10.grpo.interfaces import SamplingParams, TokenBatch
from slime_gb10.grpo.models import (
    eos_token_ids,
    load_causal_lm,
    write_random_model,
)


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=1)


def make_backend(tiny_dir, tokenizer, **kwargs):
    model = load_causal_lm(str(tiny_dir))
    from slime_gb10.grpo.config import TrainConfig

    return TorchPolicyBackend(model, tokenizer, "cpu", train=TrainConfig(lr=kwargs.pop("lr", 1e-3)), **kwargs)


def random_batch(tokenizer, seed=0, rows=4):
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(rows):
        prompt = torch.randint(0, len(tokenizer), (3 + i,), generator=gen).tolist()
        completion = torch.randint(0, len(tokenizer), (2 + 2 * i,), generator=gen).tolist()
        samples.append(
            Sample(
                prompt,
                completion,
                [0.0] * len(completion),
                advantage=float(i) - 1.5,
                reward=0.0,
                truncated=False,
            )
        )
    return samples


def test_logprobs_equal_full_forward_in_float64(tiny_dir, tokenizer):
    backend = make_backend(tiny_dir, tokenizer, temperature=0.8)
    batch, _ = collate(random_batch(tokenizer), tokenizer.pad_token_id)
    logprobs, entropy = backend.logprobs(batch, with_entropy=True)
    model64 = copy.deepcopy(backend.model).double()
    with torch.no_grad():
        logits = model64(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits / 0.8
    logp = torch.log_softmax(logits, dim=-1)
    expected = torch.zeros_like(logprobs, dtype=torch.float64)
    expected_entropy = torch.zeros_like(expected)
    expected[:, 1:] = logp[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    expected_entropy[:, 1:] = -(logp.exp() * logp).sum(-1)[:, :-1]
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(logprobs[mask].double(), expected[mask], atol=1e-4, rtol=0)
    torch.testing.assert_close(entropy[mask].double(), expected_entropy[mask], atol=1e-4, rtol=0)
    assert (logprobs[~mask] == 0).all()


def test_right_padding_is_told_apart_from_left_padding():
    assert right_padded(torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]))
    assert right_padded(torch.ones(2, 4, dtype=torch.bool))
    assert not right_padded(torch.tensor([[1, 1, 1], [0, 1, 1]]))  # left padding
    assert not right_padded(torch.tensor([[1, 0, 1]]))  # a hole


def test_a_left_padded_batch_keeps_its_mask(tiny_dir, tokenizer):
    """Right padding runs without an attention mask; any other layout must still pass the mask:
    the same sequences left-padded give the logprobs of the right-padded batch."""
    backend = make_backend(tiny_dir, tokenizer)
    right, _ = collate(random_batch(tokenizer, seed=3), tokenizer.pad_token_id)
    lengths = right.attention_mask.sum(1)
    shift = lambda t: torch.stack(  # noqa: E731 - roll each row's padding to its front
        [row.roll(int(row.numel() - n)) for row, n in zip(t, lengths, strict=True)]
    )
    left = TokenBatch(shift(right.input_ids), shift(right.attention_mask), shift(right.completion_mask))
    assert not right_padded(left.attention_mask)
    lp_right, _ = backend.logprobs(right)
    lp_left, _ = backend.logprobs(left)
    torch.testing.assert_close(shift(lp_right), lp_left, atol=1e-5, rtol=0)


def test_right_padded_batches_reach_the_layers_without_a_mask_and_compile_once(
    tiny_dir, tokenizer, monkeypatch
):
    """A batch without padding and batches with right padding (other lengths) run the decoder
    layers with no attention mask -- transformers builds none from the positions -- so the layers
    compiled with dynamic shapes are traced once (a counting backend stands in for inductor), and
    the logprobs are those of the plain model given the mask."""
    from slime_gb10.grpo.backends.torch_backend import compile_decoder_layers, token_logprobs

    model = load_causal_lm(str(tiny_dir))
    plain = copy.deepcopy(model)
    traced, masks, layer_masks = [], [], []
    modeling = importlib.import_module(type(model).__module__)  # transformers' module of this model
    build_mask = modeling.create_causal_mask
    monkeypatch.setattr(
        modeling, "create_causal_mask", lambda *a, **k: masks.append(build_mask(*a, **k)) or masks[-1]
    )
    compile_decoder_layers(model, backend=lambda gm, example_inputs: traced.append(gm) or gm.forward)
    gen = torch.Generator().manual_seed(5)
    for rows, length, padded in ((4, 12, 0), (4, 12, 2), (3, 15, 3)):
        ids = torch.randint(0, len(tokenizer), (rows, length), generator=gen)
        attention = torch.ones(rows, length, dtype=torch.long)
        for r in range(padded):
            attention[r, length - 2 - r :] = 0
        completion = attention.clone()
        completion[:, :4] = 0
        batch = TokenBatch(ids, attention, completion)
        assert right_padded(attention)
        with torch.no_grad():
            got, _ = token_logprobs(model, batch, temperature=1.0, with_entropy=False, autocast_dtype=None)
            layer_masks.append(masks[-1])
            logits = plain(input_ids=ids, attention_mask=attention).logits.double()
        want = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        keep = completion[:, 1:].bool()
        torch.testing.assert_close(got[:, 1:][keep].double(), want[keep], atol=1e-4, rtol=0)
    assert all(m is None for m in layer_masks)  # what the layers got, per batch
    assert len(traced) == 1


def _policy_gradient_loss(logprobs, entropy, batch, extras):
    # sum over tokens of -A * logp, divided by the minibatch's token count: microbatch losses add up
    per_token = -extras["advantages"][:, None] * logprobs * batch.completion_mask
    return per_token.sum() / extras["global_count"], {"entropy": entropy[batch.completion_mask.bool()].mean()}


def test_microbatches_equal_one_batch(tiny_dir, tokenizer):
    samples = random_batch(tokenizer, seed=2, rows=6)
    whole = make_backend(tiny_dir, tokenizer)
    split = make_backend(tiny_dir, tokenizer)
    count = float(sum(len(s.completion_ids) for s in samples))
    batch, extras = collate(samples, tokenizer.pad_token_id)
    extras["global_count"] = count
    r1 = whole.train_step([(batch, extras)], _policy_gradient_loss)
    micro = []
    for part in (samples[:2], samples[2:3], samples[3:]):
        b, e = collate(part, tokenizer.pad_token_id)
        e["global_count"] = count
        micro.append((b, e))
    r2 = split.train_step(micro, _policy_gradient_loss)
    assert r1.grad_norm == pytest.approx(r2.grad_norm, rel=1e-4)
    assert r1.loss == pytest.approx(r2.loss, rel=1e-4)
    for (name, p1), p2 in zip(whole.model.named_parameters(), split.model.parameters()):
        torch.testing.assert_close(p1, p2, atol=1e-6, rtol=1e-4, msg=name)


def _one_step(backend, samples, tokenizer):
    batch, extras = collate(samples, tokenizer.pad_token_id)
    extras["global_count"] = float(batch.completion_mask.sum())
    return backend.train_step([(batch, extras)], _policy_gradient_loss)


def test_compiled_layers_train_like_the_plain_ones(tiny_dir, tokenizer, monkeypatch):
    """Dynamo traces the real HF decoder layers and the LM head's blocks (backend "eager": the
    tracing without inductor's C++/Triton codegen, which needs a GPU or a compiler this CPU test
    does not assume); the step equals the plain one. Inductor's numbers are compared on the GPU
    (test_torch_backend_gpu). The head's blocks as wide as the plain path's: other widths sum the
    vocabulary in another order, and Adam magnifies that last-bit change on near-zero gradients."""
    from slime_gb10.grpo.backends import torch_backend

    monkeypatch.setattr(torch_backend, "COMPILED_HEAD_CHUNK", 4096)
    torch._dynamo.reset()
    samples = random_batch(tokenizer, seed=4, rows=5)
    plain = make_backend(tiny_dir, tokenizer)
    compiled = make_backend(tiny_dir, tokenizer, compile_backend="eager")
    assert compiled.stats() == {"compiled": 1.0} and plain.stats() == {"compiled": 0.0}
    r1, r2 = _one_step(plain, samples, tokenizer), _one_step(compiled, samples, tokenizer)
    assert compiled.compiled
    assert r2.loss == pytest.approx(r1.loss, rel=1e-5) and r2.grad_norm == pytest.approx(
        r1.grad_norm, rel=1e-5
    )
    # the state dict keeps its names (nn.Module.compile wraps no module), so checkpoints and sync agree
    assert plain.model.state_dict().keys() == compiled.model.state_dict().keys()
    for (name, p1), p2 in zip(plain.model.named_parameters(), compiled.model.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, atol=1e-6, rtol=1e-5, msg=name)


def test_a_compiler_that_fails_falls_back_to_the_plain_layers(tiny_dir, tokenizer, caplog):
    torch._dynamo.reset()

    def no_codegen(graph_module, example_inputs):  # a compiler that cannot build for this GPU
        raise RuntimeError("ptxas fatal: Value 'sm_121a' is not defined for option 'gpu-name'")

    samples = random_batch(tokenizer, seed=5, rows=3)
    plain = make_backend(tiny_dir, tokenizer)
    broken = make_backend(tiny_dir, tokenizer, compile_backend=no_codegen)
    r1 = _one_step(plain, samples, tokenizer)
    with caplog.at_level("WARNING"):
        r2 = _one_step(broken, samples, tokenizer)
    assert "compiled decoder layers unusable" in caplog.text and "sm_121a" in caplog.text
    assert not broken.compiled and broken.stats() == {"compiled": 0.0}
    assert r2.loss == pytest.approx(r1.loss, rel=1e-6) and r2.grad_norm == pytest.approx(
        r1.grad_norm, rel=1e-6
    )
    for p1, p2 in zip(plain.model.parameters(), broken.model.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, atol=0, rtol=0)  # same plain step: no gradient left over
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["none", "nvfp4-qat"])
def test_inductor_compiled_layers_match_the_plain_ones_on_gpu(tiny_dir, tokenizer, quantization):
    """Inductor's fused layers (BF16 autocast, FP32 master weights) against the plain layers: the
    logprobs and two steps on batches of different shapes agree within BF16 rounding, and the
    compiled layers stay in use (one dynamic graph, no fallback). Under NVFP4 QAT too: the
    Triton round trip is one custom operator to Dynamo (it fell back to the plain layers before)."""
    from slime_gb10.grpo.config import TrainConfig

    torch._dynamo.reset()
    backends = [
        TorchPolicyBackend(
            load_causal_lm(str(tiny_dir)),
            tokenizer,
            "cuda",
            train=TrainConfig(lr=1e-3),
            autocast_dtype=torch.bfloat16,
            compile_backend=backend,
            quantization=quantization,
        )
        for backend in (None, "inductor")
    ]
    plain, compiled = backends
    for seed, rows in ((6, 6), (7, 3)):
        samples = random_batch(tokenizer, seed=seed, rows=rows)
        batch, _ = collate(samples, tokenizer.pad_token_id)
        mask = batch.completion_mask.bool()
        lp_plain, lp_compiled = plain.logprobs(batch)[0], compiled.logprobs(batch)[0]
        torch.testing.assert_close(lp_compiled[mask], lp_plain[mask], atol=5e-2, rtol=0)
        r1, r2 = _one_step(plain, samples, tokenizer), _one_step(compiled, samples, tokenizer)
        assert r2.loss == pytest.approx(r1.loss, rel=3e-2, abs=1e-3)
        assert r2.grad_norm == pytest.approx(r1.grad_norm, rel=3e-2)
    # (the second batch's logprobs are those of the two models after their first update)
    assert compiled.compiled and compiled.stats() == {"compiled": 1.0}
    torch._dynamo.reset()


def test_nan_loss_raises_before_the_optimizer_step(tiny_dir, tokenizer):
    backend = make_backend(tiny_dir, tokenizer)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    batch, extras = collate(random_batch(tokenizer), tokenizer.pad_token_id)
    with pytest.raises(NonFiniteError, match="not finite"):
        backend.train_step([(batch, extras)], lambda lp, ent, b, e: (lp.sum() * float("nan"), {}))
    for name, tensor in backend.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert all(p.grad is None for p in backend.model.parameters())


def test_weight_sync_makes_the_engine_bit_identical(tiny_dir, tokenizer):
    backend = make_backend(tiny_dir, tokenizer, lr=1e-2)
    batch, extras = collate(random_batch(tokenizer), tokenizer.pad_token_id)
    extras["global_count"] = float(batch.completion_mask.sum())
    backend.train_step([(batch, extras)], _policy_gradient_loss)  # the weights now differ from the file
    engine_model = load_causal_lm(str(tiny_dir))
    engine = TorchRolloutEngine(
        engine_model, tokenizer, "cpu", eos_token_ids=eos_token_ids(tokenizer, engine_model)
    )
    assert not torch.equal(
        engine_model.model.layers[0].mlp.up_proj.weight, backend.model.model.layers[0].mlp.up_proj.weight
    )
    engine.update_weights(backend.export_weights(bucket_bytes=64 * 1024))  # many small buckets
    for name, tensor in backend.model.state_dict().items():
        assert torch.equal(engine_model.state_dict()[name], tensor), name
    # and the engine's logprobs of its own samples equal the trainer's (same weights, same temperature)
    gens = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=5, seed=0))
    samples = [Sample(g.prompt_ids, g.completion_ids, g.completion_logprobs, 0.0, 0.0, False) for g in gens]
    batch, extras = collate(samples, tokenizer.pad_token_id)
    trainer_lp, _ = backend.logprobs(batch)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(trainer_lp[mask], extras["rollout_logprobs"][mask], atol=1e-4, rtol=0)


def test_token_batch_layout(tokenizer):
    s = Sample([5, 6, 7], [8, 9], [-0.5, -0.25], advantage=1.0, reward=1.0, truncated=False)
    t = Sample([1], [2, 3, 4], [-1.0, -2.0, -3.0], advantage=-1.0, reward=0.0, truncated=True, train=False)
    batch, extras = collate([s, t], pad_token_id=0)
    assert isinstance(batch, TokenBatch)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.completion_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]  # train=False: masked out
    assert extras["rollout_logprobs"][0].tolist() == [0, 0, 0, -0.5, -0.25]
    assert extras["advantages"].tolist() == [1.0, -1.0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_final_model_is_written_in_its_dtype_tied_once(tiny_dir, tokenizer, tmp_path, dtype):
    """final_model/ holds the master weights cast to ``dtype`` (BF16 by default: half the bytes),
    a tied lm_head written once, and a config that says what the files hold."""
    import json

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    backend = make_backend(tiny_dir, tokenizer)
    backend.save_pretrained(str(tmp_path / "out"), dtype=dtype)
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_tensor(n).dtype for n in names} == {dtype}
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == str(dtype).removeprefix(
        "torch."
    )
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert loaded.dtype == dtype
    for name, param in backend.model.named_parameters():
        assert torch.equal(loaded.get_parameter(name), param.detach().to(dtype)), name
    assert backend.model.dtype == torch.float32  # the master weights are untouched


def test_warmup_is_one_function_for_both_backends():
    """Linear warmup, hand values: step s of 4 warmup steps gets (s + 1) / 4, then 1; none: 1."""
    from slime_gb10.grpo.backends.common import warmup_factor

    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0 and warmup_factor(7, 0) == 1.0


def test_resuming_keeps_the_checkpoints_moments_and_takes_the_configs_lr(tiny_dir, tokenizer):
    """Two optimizer steps of a 4-step warmup, saved; loaded with the same config the optimizer is
    the saved one bit for bit, loaded with another lr (``--resume --lr``) the next step runs at the
    new lr x 3/4 (the warmup continues) with the saved Adam moments."""
    from slime_gb10.grpo.config import TrainConfig

    def backend(lr):
        train = TrainConfig(lr=lr, warmup_steps=4, weight_decay=0.0)
        return TorchPolicyBackend(load_causal_lm(str(tiny_dir)), tokenizer, "cpu", train=train)

    first = backend(1e-3)
    batch, extras = collate(random_batch(tokenizer), tokenizer.pad_token_id)
    extras["global_count"] = float(batch.completion_mask.sum())
    for _ in range(2):
        first.train_step([(batch, extras)], _policy_gradient_loss)
    state = copy.deepcopy(first.state_dict())

    same = backend(1e-3)
    same.load_state_dict(copy.deepcopy(state))
    assert same.optimizer.param_groups[0]["lr"] == first.optimizer.param_groups[0]["lr"] == 1e-3 * 0.75
    assert same.optimizer.state_dict()["param_groups"] == first.optimizer.state_dict()["param_groups"]

    lower = backend(1e-4)
    lower.load_state_dict(copy.deepcopy(state))
    assert lower.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 * 0.75, rel=1e-12)
    moments = first.optimizer.state_dict()["state"]
    for key, value in lower.optimizer.state_dict()["state"].items():
        assert torch.equal(value["exp_avg"], moments[key]["exp_avg"])
    assert lower.train_step([(batch, extras)], _policy_gradient_loss).metrics["lr"] == pytest.approx(
        1e-4, rel=1e-12
    )


def test_one_accumulation_pass_weights_metrics_by_tokens_and_checks_the_summed_loss():
    """Two microbatches of 2 and 3 completion tokens (hand-derived): a metric 1 then 2 averages to
    (2 + 6) / 5; one NaN in the first microbatch counts only the second, 4 x 3 / 5; one NaN in both
    is left out; a python number 0.5 then 1 gives (1 + 3) / 5. The losses sum (times loss_scale).
    A NaN loss discards the gradients and raises after the pass, before any optimizer step."""
    from slime_gb10.grpo.backends.common import accumulate_gradients

    weight = torch.nn.Parameter(torch.tensor(1.0))

    def batch(tokens):
        mask = torch.zeros(1, 4, dtype=torch.long)
        mask[0, :tokens] = 1
        return TokenBatch(
            input_ids=torch.zeros(1, 4, dtype=torch.long),
            attention_mask=torch.ones_like(mask),
            completion_mask=mask,
        )

    nan = float("nan")
    per_batch = iter([(1.0, nan, nan, 0.5, 1.0), (2.0, 4.0, nan, 1.0, 3.0)])

    def loss_fn(logprobs, entropy, b, extras):
        a, half, never, host, loss = next(per_batch)
        metrics = {
            "a": torch.tensor(a),
            "half": torch.tensor(half),
            "never": torch.tensor(never),
            "host": host,
        }
        return weight * loss, metrics

    discarded = []
    micro = [(batch(2), {}), (batch(3), {"loss_scale": 2.0})]
    total, metrics = accumulate_gradients(
        micro, device=torch.device("cpu"), forward=lambda b: (None, None), loss_fn=loss_fn,
        discard_gradients=lambda: discarded.append(True),
    )  # fmt: skip
    assert total == pytest.approx(1.0 + 2 * 3.0)
    assert metrics == pytest.approx({"a": 1.6, "half": 2.4, "host": 0.8})
    assert float(weight.grad) == pytest.approx(1.0 + 2 * 3.0) and not discarded

    per_batch = iter([(1.0, 1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0, nan)])
    with pytest.raises(NonFiniteError, match="not finite"):
        accumulate_gradients(
            micro, device=torch.device("cpu"), forward=lambda b: (None, None), loss_fn=loss_fn,
            discard_gradients=lambda: discarded.append(True),
        )  # fmt: skip
    assert discarded == [True]
