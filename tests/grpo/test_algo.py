"""GRPO math against hand-computed values (every expected number is derived in the comments)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_gb10.grpo.algo import (
    aggregate_loss,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    kl_k3,
    masked_mean,
    truncated_importance_weights,
    zero_variance_groups,
)

LN2 = math.log(2.0)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=tol,
        rtol=tol,
    )


# --- group advantages ------------------------------------------------------------------------


def test_advantages_group_of_two():
    # rewards [1,0 | 0,1], G=2: each group has mean 0.5, unbiased std sqrt((0.25+0.25)/1) = sqrt(0.5)
    # => A = +-0.5 / sqrt(0.5) = +-0.70710678
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2, eps=0.0)
    close(adv, [0.70710678, -0.70710678, -0.70710678, 0.70710678])


def test_advantages_group_of_four():
    # rewards [1,0,0,1], G=4: mean 0.5, unbiased std sqrt(4*0.25/3) = sqrt(1/3) = 0.57735027
    # => A = +-0.5 / 0.57735027 = +-0.8660254
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4, eps=0.0)
    close(adv, [0.8660254, -0.8660254, -0.8660254, 0.8660254])


def test_advantages_eps_in_denominator():
    # same as above with eps=0.1: 0.5 / (0.57735027 + 0.1) = 0.73817...
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4, eps=0.1)
    close(adv[0], 0.5 / (math.sqrt(1 / 3) + 0.1))


def test_advantages_dr_grpo_no_std():
    # Dr. GRPO: r - mean only. [3,1 | 2,2] -> means 2, 2 -> [1,-1,0,0]
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), group_size=2, scale_std=False)
    close(adv, [1.0, -1.0, 0.0, 0.0])


def test_advantages_zero_variance_group_is_zero_not_nan():
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2)
    assert torch.isfinite(adv).all()
    close(adv[:2], [0.0, 0.0])


def test_advantages_errors():
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        group_advantages(torch.tensor([1.0, 0.0]), group_size=1)
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=4)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), group_size=2)


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5000001])
    assert zero_variance_groups(rewards, 2).tolist() == [True, False, True, False]


# --- loss aggregation ------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_token_mean():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5   (the 9s are masked out)
    close(aggregate_loss(LOSS, MASK, "token-mean"), 2.5)


def test_seq_mean():
    # per-sequence means: (1+2+3)/3 = 2 and 4/1 = 4; mean over 2 sequences = 3
    close(aggregate_loss(LOSS, MASK, "seq-mean"), 3.0)


def test_dr_grpo():
    # sum 10 / (B=2 * max_len=5) = 1.0
    close(aggregate_loss(LOSS, MASK, "dr-grpo", max_len=5), 1.0)
    with pytest.raises(ValueError, match="max_len"):
        aggregate_loss(LOSS, MASK, "dr-grpo")


def test_unknown_aggregation():
    with pytest.raises(ValueError, match="token-mean, seq-mean, dr-grpo"):
        aggregate_loss(LOSS, MASK, "mean")  # type: ignore[arg-type]


def test_seq_mean_empty_sequence_counts_in_batch():
    # second sequence fully masked: (2 + 0) / 2 = 1
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(aggregate_loss(LOSS, mask, "seq-mean"), 1.0)
    close(aggregate_loss(LOSS, torch.zeros_like(mask), "token-mean"), 0.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean", "dr-grpo"])
def test_global_count_microbatches_sum_to_minibatch(mode):
    # Splitting the minibatch into per-row microbatches with the global denominator: the
    # microbatch losses sum to the minibatch loss.
    full = aggregate_loss(LOSS, MASK, mode, max_len=5)
    count = MASK.sum().item() if mode == "token-mean" else 2
    parts = [
        aggregate_loss(LOSS[i : i + 1], MASK[i : i + 1], mode, max_len=5, global_count=count)
        for i in range(2)
    ]
    close(sum(parts), full)


# --- clipped surrogate -----------------------------------------------------------------------


def test_clipping_both_epsilons():
    # old = 0, logprob = log r. eps_low = 0.2, eps_high = 0.28
    #  r     A   r*A    clip(r)*A   -min      clipped?
    # 1.5   +1   1.5    1.28        -1.28     yes (above 1+eps_high)
    # 1.25  +1   1.25   1.25        -1.25     no  (would be clipped with a symmetric 0.2)
    # 0.5   +1   0.5    0.8         -0.5      no  (min picks unclipped)
    # 0.5   -1  -0.5   -0.8          0.8      yes (below 1-eps_low)
    # 0.79  -1  -0.79  -0.8          0.8      yes
    # 1.5   -1  -1.5   -1.28         1.5      no
    r = torch.tensor([[1.5, 1.25, 0.5, 0.5, 0.79, 1.5]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]])
    loss, clipped = clipped_surrogate(torch.log(r), torch.zeros_like(r), adv, eps_low=0.2, eps_high=0.28)
    close(loss, [[-1.28, -1.25, -0.5, 0.8, 0.8, 1.5]])
    assert clipped.tolist() == [[True, False, False, True, True, False]]


def test_clipped_tokens_get_no_gradient():
    r = torch.tensor([[1.5, 1.1]])
    lp = torch.log(r).requires_grad_()
    loss, _ = clipped_surrogate(lp, torch.zeros_like(r), torch.tensor([2.0]), eps_low=0.2, eps_high=0.28)
    loss.sum().backward()
    # clipped token: 0; unclipped: d(-r*A)/dlp = -r*A = -1.1*2 = -2.2
    close(lp.grad, [[0.0, -2.2]])


def test_advantage_shape_errors():
    with pytest.raises(ValueError, match="batch size"):
        clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), eps_low=0.2, eps_high=0.28)


# --- KL, TIS, overlong -----------------------------------------------------------------------


def test_kl_k3_known_values():
    # d = ref - lp. d = ln2: 2 - ln2 - 1 = 0.30685282; d = 0: 0; d = -ln2: 0.5 + ln2 - 1 = 0.19314718
    lp = torch.zeros(3)
    ref = torch.tensor([LN2, 0.0, -LN2])
    close(kl_k3(lp, ref), [1 - LN2, 0.0, LN2 - 0.5])


def test_tis_weights_cap_and_detach():
    # old - rollout = ln 3 -> 3 capped at 2; = -ln 2 -> 0.5; = 0 -> 1
    old = torch.zeros(3, requires_grad=True)
    rollout = torch.tensor([-math.log(3.0), LN2, 0.0])
    w = truncated_importance_weights(old, rollout, cap=2.0)
    close(w, [2.0, 0.5, 1.0])
    assert not w.requires_grad
    close(truncated_importance_weights(old, rollout, cap=5.0)[0], 3.0)
    with pytest.raises(ValueError):
        truncated_importance_weights(old, rollout, cap=0.0)


def test_masked_mean():
    close(masked_mean(torch.tensor([[1.0, 5.0], [3.0, 7.0]]), torch.tensor([[1, 0], [1, 0]])), 2.0)


# --- full loss -------------------------------------------------------------------------------


def test_grpo_loss_hand_example():
    # B=2, T=2, mask [[1,1],[1,0]], old = 0, ratios r = [[1.5, 1.0], [0.5, 3.0]], A = [+1, -1]
    # clip loss: [[-1.28, -1.0], [0.8, -]]      (token [1,1] masked)
    # rollout = [[0, ln2], [-ln2, 0]] -> TIS w = exp(old - rollout) capped at 1.5: [[1, 0.5], [1.5, 1]]
    # ref = [[0, 0], [0, 0]]: k3 with d = -ln r: r=1.5: 1/1.5 + ln1.5 - 1 = 0.07213; r=1: 0; r=0.5: 2 - ln2 - 1
    # entropy = [[1, 2], [3, 4]]
    # per token = w * clip + 0.1 * k3 - 0.01 * H
    r = torch.tensor([[1.5, 1.0], [0.5, 3.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rollout = torch.tensor([[0.0, LN2], [-LN2, 0.0]])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    k3 = [1 / 1.5 + math.log(1.5) - 1, 0.0, 1 - LN2]
    tokens = [
        1.0 * -1.28 + 0.1 * k3[0] - 0.01 * 1,
        0.5 * -1.0 + 0.1 * k3[1] - 0.01 * 2,
        1.5 * 0.8 + 0.1 * k3[2] - 0.01 * 3,
    ]
    loss, m = grpo_loss(
        torch.log(r),
        torch.zeros_like(r),
        torch.tensor([1.0, -1.0]),
        mask,
        rollout_logprobs=rollout,
        ref_logprobs=torch.zeros_like(r),
        entropy=entropy,
        beta=0.1,
        entropy_coef=0.01,
        tis_cap=1.5,
    )
    close(loss, sum(tokens) / 3)
    close(m["clip_frac"], 2 / 3)  # tokens 0 (high) and 2 (low) clipped
    close(m["clip_frac_high"], 1 / 3)
    close(m["clip_frac_low"], 1 / 3)
    close(m["ratio_mean"], (1.5 + 1.0 + 0.5) / 3)
    close(m["kl"], sum(k3) / 3)
    close(m["entropy"], 2.0)
    close(m["tis_weight_mean"], 1.0)  # (1 + 0.5 + 1.5) / 3
    close(m["tis_clipped_frac"], 1 / 3)  # raw weights 1, 0.5, 2 (token [1,0]) over the cap 1.5
    close(m["pg_loss"], (-1.28 - 0.5 + 1.2) / 3)
    assert all(not v.requires_grad for v in m.values())

    seq_loss, _ = grpo_loss(
        torch.log(r),
        torch.zeros_like(r),
        torch.tensor([1.0, -1.0]),
        mask,
        rollout_logprobs=rollout,
        ref_logprobs=torch.zeros_like(r),
        entropy=entropy,
        beta=0.1,
        entropy_coef=0.01,
        tis_cap=1.5,
        loss_agg="seq-mean",
    )
    close(seq_loss, ((tokens[0] + tokens[1]) / 2 + tokens[2]) / 2)


def test_grpo_loss_plain_and_gradient():
    # No TIS/KL/entropy; r = 1 everywhere (on-policy step): loss = -mean(A) over tokens and
    # d loss / d lp_t = -A_t / N_tokens. A = [2, -1], mask 2 + 1 tokens -> loss = -(2+2-1)/3 = -1
    lp = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = grpo_loss(lp, lp.detach(), torch.tensor([2.0, -1.0]), mask)
    close(loss, -1.0)
    loss.backward()
    close(lp.grad, [[-2 / 3, -2 / 3], [1 / 3, 0.0]])
    assert math.isnan(m["kl"].item()) and math.isnan(m["entropy"].item())
    close(m["tis_weight_mean"], 1.0)
    close(m["tis_clipped_frac"], 0.0)  # TIS off
    close(m["clip_frac"], 0.0)


def test_grpo_loss_missing_inputs():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(z, z, torch.zeros(1), z + 1, beta=0.1)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        grpo_loss(z, z, torch.zeros(1), z + 1, tis_cap=2.0)
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(z, z, torch.zeros(1), z + 1, entropy_coef=0.1)


def test_grpo_loss_dr_grpo():
    # r = 1, A = [1, 1], 3 tokens, max_len 10: -(1+1+1) / (2 * 10) = -0.15
    lp = torch.zeros(2, 2)
    loss, _ = grpo_loss(
        lp, lp, torch.ones(2), torch.tensor([[1.0, 1.0], [1.0, 0.0]]), loss_agg="dr-grpo", max_len=10
    )
    close(loss, -0.15)


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=2, max_value=8),
    st.integers(min_value=1, max_value=5),
    st.data(),
)
def test_advantages_properties(group_size, num_groups, data):
    values = data.draw(
        st.lists(
            st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]),
            min_size=group_size * num_groups,
            max_size=group_size * num_groups,
        )
    )
    rewards = torch.tensor(values, dtype=torch.float64)
    adv = group_advantages(rewards, group_size, eps=0.0).view(num_groups, -1)
    centered = group_advantages(rewards, group_size, scale_std=False).view(num_groups, -1)
    zero = zero_variance_groups(rewards, group_size)
    for g in range(num_groups):
        r = rewards.view(num_groups, -1)[g]
        torch.testing.assert_close(centered[g], r - r.mean())
        assert bool(zero[g]) == (len(set(r.tolist())) == 1)
        if zero[g]:
            assert (centered[g] == 0).all()
        else:  # standardised: mean 0, unbiased std 1
            torch.testing.assert_close(
                adv[g].mean(), torch.tensor(0.0, dtype=torch.float64), atol=1e-9, rtol=0
            )
            torch.testing.assert_close(adv[g].std(), torch.tensor(1.0, dtype=torch.float64))
    # with the default eps a constant group gives exactly 0, never NaN
    assert torch.isfinite(group_advantages(rewards, group_size)).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.floats(-3, 3), st.data())
def test_on_policy_gradient_is_minus_advantage_over_tokens(batch, length, adv_scale, data):
    # at ratio 1 (old = logprobs) the token-mean loss gradient per kept token is -A_i / N_tokens
    mask_bits = data.draw(st.lists(st.booleans(), min_size=batch * length, max_size=batch * length))
    mask = torch.tensor(mask_bits, dtype=torch.float64).view(batch, length)
    adv = adv_scale * torch.arange(1, batch + 1, dtype=torch.float64)
    lp = torch.randn(batch, length, dtype=torch.float64, requires_grad=True)
    loss, _ = grpo_loss(lp, lp.detach(), adv, mask)
    loss.backward()
    n = max(mask.sum().item(), 1.0)
    torch.testing.assert_close(lp.grad, -adv[:, None] * mask / n)


@pytest.mark.parametrize("value", [0.1, 0.3, 0.7, 1.1])
def test_equal_rewards_give_exactly_zero_advantage(value):
    """Found in review: float32 mean(eight 0.1s) != 0.1, and / (std + eps) blew the ulp up to ~1e-2."""
    rewards = torch.tensor([value] * 8 + [0.0, 1.0] * 4)
    adv = group_advantages(rewards, 8)
    assert torch.equal(adv[:8], torch.zeros(8))
    assert adv[8:].abs().min() > 0.9  # the mixed group is untouched: +-1/std(unbiased) = +-0.935


def test_grpo_loss_object_binds_the_config_and_defaults_old_to_the_detached_current():
    from types import SimpleNamespace

    from slime_gb10.grpo.algo import GRPOLoss, grpo_loss
    from slime_gb10.grpo.config import AlgoConfig

    g = torch.Generator().manual_seed(3)
    logprobs = -torch.rand(2, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float64)
    extras = {"advantages": torch.tensor([0.5, -1.0], dtype=torch.float64), "global_count": 7.0,
              "rollout_logprobs": logprobs - 0.1 * torch.rand(2, 5, generator=g, dtype=torch.float64)}  # fmt: skip
    entropy = torch.rand(2, 5, generator=g, dtype=torch.float64)
    config = AlgoConfig(eps_low=0.1, eps_high=0.3, entropy_coef=0.01, tis_cap=2.0, loss_agg="dr-grpo")
    loss_fn = GRPOLoss.from_config(config, max_new_tokens=4)
    got, _ = loss_fn(logprobs, entropy, SimpleNamespace(completion_mask=mask), extras)
    expected, _ = grpo_loss(
        logprobs, logprobs.detach(), extras["advantages"], mask, rollout_logprobs=extras["rollout_logprobs"],
        entropy=entropy, eps_low=0.1, eps_high=0.3, entropy_coef=0.01, tis_cap=2.0, loss_agg="dr-grpo",
        max_len=4, global_count=7.0,
    )  # fmt: skip
    assert torch.equal(got, expected)


def test_the_loss_is_built_by_its_config_name():
    from slime_gb10.grpo.algo import LOSSES, GRPOLoss, build_loss
    from slime_gb10.grpo.config import AlgoConfig, ConfigError, build_config

    loss_fn = build_loss(AlgoConfig(eps_high=0.3, loss_agg="seq-mean"), max_new_tokens=16)
    assert loss_fn == GRPOLoss(eps_high=0.3, tis_cap=2.0, loss_agg="seq-mean", max_len=16)
    assert sorted(LOSSES) == sorted(
        AlgoConfig.model_fields["loss"].annotation.__args__
    )  # each name has a class
    with pytest.raises(ConfigError, match=r"algo\.loss"):
        build_config(sets=["algo.loss=gspo"])


# --- the trainer/rollout mismatch (issue #39), on hand-computed numbers ------------------------------
MM_TRAIN = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
MM_ROLLOUT = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -0.6, -0.4]], dtype=torch.float64)
MM_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)


def test_rollout_mismatch_by_hand():
    from slime_gb10.grpo.algo import rollout_mismatch

    # d = train - rollout on the five tokens: 0.5, -1.0 | 0.0, 0.1, -0.1
    d = [0.5, -1.0, 0.0, 0.1, -0.1]
    got = rollout_mismatch(MM_TRAIN, MM_ROLLOUT, MM_MASK)
    assert got["mismatch_k1"].item() == pytest.approx(sum(-x for x in d) / 5)  # 0.1
    assert got["mismatch_k3"].item() == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 5)
    assert got["mismatch_exp_abs"].item() == pytest.approx(sum(math.exp(abs(x)) for x in d) / 5)
    assert got["mismatch_exp_abs_median"].item() == pytest.approx(math.exp(0.1))  # of 1, e^.1, e^.1, e^.5, e
    assert (
        got["mismatch_k3"].item() > 0
        and rollout_mismatch(MM_TRAIN, MM_TRAIN, MM_MASK)["mismatch_k3"].item() == 0
    )


@pytest.mark.parametrize(
    ("level", "high", "keep"),
    [
        # sequence ratios: exp(-0.5) = 0.607 and exp(0.0) = 1; geometric: exp(-0.25) = 0.779 and 1
        ("sequence", 2.0, [1.0, 1.0]),
        ("sequence", 1.5, [0.0, 1.0]),  # 0.607 < 1/1.5
        ("geometric", 1.5, [1.0, 1.0]),  # 0.779 >= 1/1.5
        ("geometric", 1.2, [0.0, 1.0]),  # 0.779 < 1/1.2
        ("none", 1.2, [1.0, 1.0]),
    ],
)
def test_masked_importance_sampling_by_hand(level, high, keep):
    from slime_gb10.grpo.algo import mismatch_masking

    assert mismatch_masking(MM_TRAIN, MM_ROLLOUT, MM_MASK, level, high).tolist() == keep


def test_a_masked_sequence_leaves_the_loss_and_is_counted():
    from slime_gb10.grpo.algo import grpo_loss

    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    loss, metrics = grpo_loss(
        MM_TRAIN, MM_TRAIN.detach(), adv, MM_MASK, rollout_logprobs=MM_ROLLOUT, mis="sequence", mis_high=1.5
    )
    dropped = MM_MASK * torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    expected, _ = grpo_loss(MM_TRAIN, MM_TRAIN.detach(), adv, dropped)
    assert loss.item() == pytest.approx(expected.item()) and metrics["mis_masked_frac"].item() == 0.5
    assert metrics["mismatch_k1"].item() == pytest.approx(0.1)  # over every token, masked or not
    with pytest.raises(ValueError, match="needs rollout_logprobs"):
        grpo_loss(MM_TRAIN, MM_TRAIN.detach(), adv, MM_MASK, mis="geometric")
