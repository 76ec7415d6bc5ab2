"""Ranks agree or refuse, and a failed collective is one line (issue #41): the pure parts, without
torchrun (the launches are in test_distributed.py). Inputs are written by hand: what each rank would
gather, and the RuntimeError texts gloo raises (copied from torch 2.13's gloo: a peer that timed
out, one whose process exited)."""

from __future__ import annotations

import pytest
import torch

from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.data import PromptExample
from slime_gb10.grpo.distributed import (
    RANK_LOCAL_SETTINGS,
    DistContext,
    DistributedError,
    LaunchError,
    collective_failure,
    data_disagreement,
    data_report,
    settings_disagreement,
    settings_of,
)

GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "3000ms for recv operation to complete"
)
GLOO_AFTER_TIMEOUT = "Application timeout caused pair closure"
GLOO_PEER_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:39615. This is typically caused by a remote worker crashing."
)


def test_the_same_settings_agree_and_one_difference_is_named_with_both_values():
    same = {"train.lr": 1e-5, "train.steps": 10, "data.reward": "auto"}
    assert settings_disagreement([same, dict(same), dict(same)]) is None
    other = {**same, "train.lr": 2e-5}
    assert settings_disagreement([same, other]) == (
        "ranks disagree on their settings: train.lr is 1e-05 on rank 0 and 2e-05 on rank 1; "
        "launch every rank with the same command"
    )


def test_several_differences_name_each_key_and_group_the_ranks_by_value():
    r0 = {"train.lr": 0.01, "train.steps": 2, "data.reward": "math", "rollout.stop": ["\n"]}
    r1 = {**r0, "train.steps": 3}
    r2 = {**r0, "train.steps": 3, "data.reward": "boxed"}
    r3 = {k: v for k, v in r0.items() if k != "rollout.stop"}  # another version of the code
    assert settings_disagreement([r0, r1, r2, r3]) == (
        "ranks disagree on their settings: data.reward is 'math' on rank 0 and 'boxed' on rank 2; "
        'rollout.stop is ["\\n"] on rank 0 and <unset> on rank 3; '
        "train.steps is 2 on rank 0 and 3 on ranks 1, 2; launch every rank with the same command"
    )


def test_many_differences_are_cut_short():
    r0 = {f"train.k{i}": i for i in range(9)}
    r1 = {f"train.k{i}": i + 1 for i in range(9)}
    message = settings_disagreement([r0, r1], most=2)
    assert message.startswith("ranks disagree on their settings: train.k0 is 0 on rank 0 and 1 on rank 1; ")
    assert "; and 7 more setting(s); launch every rank" in message


def test_settings_of_a_config_is_every_setting_but_the_display():
    a = build_config(overrides={"train.lr": 1e-5})
    settings = settings_of(a)
    assert settings["train.lr"] == 1e-5 and settings["train.dist_timeout_s"] == 1800
    assert settings["data.arithmetic"] == {} and settings["train.adam_betas"] == [0.9, 0.99]
    digits = settings_of(build_config(overrides={"train.lr": 1e-5, "data.arithmetic": {"max_digits": 2}}))
    assert settings_disagreement([settings, digits]) == (
        'ranks disagree on their settings: data.arithmetic is {} on rank 0 and {"max_digits": 2} on rank 1; '
        "launch every rank with the same command"
    )
    assert not RANK_LOCAL_SETTINGS & set(settings)
    quiet = build_config(overrides={"train.lr": 1e-5, "output.progress": False, "data.path": "/elsewhere"})
    assert settings_disagreement([settings, settings_of(quiet)]) is None
    faster = build_config(overrides={"train.lr": 2e-5})
    assert "train.lr is 1e-05 on rank 0 and 2e-05 on rank 1" in settings_disagreement(
        [settings, settings_of(faster)]
    )


def _examples(*truths: str) -> list[PromptExample]:
    return [PromptExample(prompt=f"What is {t}?", ground_truth=t, id=f"q{i}") for i, t in enumerate(truths)]


def test_the_same_data_agrees_and_different_data_is_named_by_its_path():
    a = build_config(overrides={"data.task": "file", "data.path": "/data/a.jsonl"}).data
    b = build_config(overrides={"data.task": "file", "data.path": "/data/b.jsonl"}).data
    same = data_report(a, _examples("1", "2"), [])
    assert data_disagreement([same, data_report(b, _examples("1", "2"), []), same]) is None  # by content
    assert data_disagreement([same, same, data_report(b, _examples("1", "3"), [])]) == (
        "ranks disagree on their data: the training examples differ between rank 0 "
        "(data.path='/data/a.jsonl', 2 examples) and rank 2 (data.path='/data/b.jsonl', 2 examples); "
        "give every rank the same data"
    )
    held_out = build_config(
        overrides={"data.task": "file", "data.path": "/data/a.jsonl", "data.eval_path": "/data/test.jsonl"}
    ).data
    r0 = data_report(held_out, _examples("1"), _examples("5", "6"))
    r1 = data_report(held_out, _examples("1"), _examples("5"))
    assert data_disagreement([r0, r1, r1]) == (
        "ranks disagree on their data: the held-out examples differ between rank 0 "
        "(data.eval_path='/data/test.jsonl', 2 examples) and rank 1 (data.eval_path='/data/test.jsonl', "
        "1 example) (also on rank 2); give every rank the same data"
    )


def test_a_generated_stream_is_compared_by_its_settings_alone():
    arithmetic = build_config().data
    task = object()  # the arithmetic task: no list of examples, its questions follow from settings
    r = data_report(arithmetic, task, _examples("7"))
    assert r["train"] == {"source": "object"} and data_disagreement([r, r]) is None


def test_a_timed_out_or_lost_collective_is_one_line_naming_the_setting_and_the_rank():
    ctx = DistContext(rank=0, world_size=2, timeout_s=30)
    with pytest.raises(DistributedError) as info, ctx._collective("a barrier"):
        raise RuntimeError(GLOO_TIMEOUT)
    assert str(info.value) == (
        "rank 1 did not answer within train.dist_timeout_s=30 s (a barrier): it died or hung, see its "
        "log; raise train.dist_timeout_s if a step (or rank 0's evaluation) legitimately takes longer"
        f" [{GLOO_TIMEOUT.strip().splitlines()[0]}]"  # gloo's own words, first line
    )
    assert isinstance(info.value, LaunchError)  # the CLI prints it as one line
    rank_1 = DistContext(rank=1, world_size=2, timeout_s=30)
    late = r"^rank 0 did not answer within train\.dist_timeout_s=30 s"
    with pytest.raises(DistributedError, match=late), rank_1._collective("a gather"):
        raise RuntimeError(GLOO_AFTER_TIMEOUT)
    with pytest.raises(DistributedError) as info, DistContext(1, 4, 1, 30)._collective("a gather"):
        raise RuntimeError(GLOO_PEER_GONE)
    assert str(info.value).startswith(
        "another of the 4 ranks did not answer (a gather): its connection closed, it died or was "
        "stopped, see its log (a rank that hangs instead ends the job after train.dist_timeout_s=30 s) ["
    )
    assert "\n" not in str(info.value)


def test_errors_that_are_not_collective_failures_pass_unchanged():
    assert collective_failure(RuntimeError(GLOO_TIMEOUT)) == "timeout"
    assert collective_failure(RuntimeError(GLOO_PEER_GONE)) == "lost"
    assert collective_failure(RuntimeError("Tensors must be contiguous")) is None
    assert collective_failure(ValueError("connection closed")) is None  # not from a collective
    # NCCL's local errors are DistBackendErrors too: not a dead peer unless its words say so
    local = getattr(torch.distributed, "DistBackendError", RuntimeError)("NCCL error: unhandled cuda error")
    assert collective_failure(local) is None
    ctx = DistContext(rank=0, world_size=2, timeout_s=30)
    with pytest.raises(RuntimeError, match="Tensors must be contiguous") as info, ctx._collective("a sum"):
        raise RuntimeError("Tensors must be contiguous")
    assert not isinstance(info.value, DistributedError)
    with pytest.raises(TypeError, match="cannot pickle"), ctx._collective("a gather"):
        raise TypeError("cannot pickle 'generator' object")


def test_one_rank_agrees_with_itself_without_collectives():
    alone = DistContext()
    splits = (_examples("1"), [])
    assert alone.agreed_data(build_config().data, splits) is splits
    alone.agree_on_settings(build_config())  # no process group: nothing to gather


def _stream(seed: int, *, device: str = "cpu"):
    from slime_gb10.grpo.weight_sync import WeightStream

    gen = torch.Generator().manual_seed(seed)
    tensors = [("embed.weight", torch.randn(300, 64, generator=gen)), ("norm.weight", torch.ones(64))]
    return WeightStream(lambda: [(n, t.to(device)) for n, t in tensors], bucket_bytes=16 * 1024)


def test_the_weights_digest_tells_checkpoints_apart_and_not_copies():
    from slime_gb10.grpo.distributed import weights_digest

    assert weights_digest(_stream(0)) == weights_digest(_stream(0))  # the same weights, loaded twice
    assert weights_digest(_stream(0)) != weights_digest(_stream(1))


def test_different_weights_are_one_line_naming_each_ranks_model():
    from slime_gb10.grpo.distributed import weights_disagreement

    same = {"model": "/data/smol", "digest": "a"}
    assert weights_disagreement([same, {"model": "/mnt/b/smol", "digest": "a"}]) is None  # another path
    assert weights_disagreement(
        [same, same, {"model": None, "digest": "b"}, {"model": "/x", "digest": "c"}]
    ) == (
        "ranks disagree on their model: the weights of rank 2 (the embedded model) differ from rank 0's "
        "(model.name_or_path='/data/smol') (also on rank 3); give every rank the same checkpoint"
    )
    # the checkpoint's path and each node's memory budget are each rank's own
    assert {"model.name_or_path", "train.memory_budget_gib"} <= RANK_LOCAL_SETTINGS


def test_ranks_that_resolved_auto_apart_are_told_so_before_the_weights():
    from slime_gb10.grpo.distributed import weights_disagreement

    r0 = {"model": "/m", "digest": "a", "choice": "sglang+megatron"}
    r1 = {
        "model": "/m",
        "digest": "b",
        "choice": "torch+torch",
    }  # the digest differs because the backend does
    assert weights_disagreement([r0, r1]) == (
        "ranks chose different engines or backends: sglang+megatron on rank 0, torch+torch on rank 1; "
        "set backends.rollout and backends.trainer explicitly"
    )
