"""GRPO math: group advantages, the clipped surrogate, KL, truncated importance sampling, loss aggregation.

Every function here is pure (tensors in, tensors out, no state) so the trainer reads like the
papers. Shapes: ``B`` completions (= ``num_groups * group_size``, each group contiguous), ``T``
token positions; per-token tensors are ``[B, T]`` and ``mask`` / ``completion_mask`` is 1 where a
token enters the loss.

References
----------
- GRPO: Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
  Language Models" (arXiv:2402.03300): group-relative advantages, per-sequence mean loss.
- PPO-clip: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347).
- DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
  (arXiv:2503.14476): clip-higher (separate eps_low / eps_high), token-level loss, dynamic
  sampling (drop groups whose rewards are all equal), overlong filtering, soft overlong punishment.
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
  (arXiv:2503.20783): no std scaling of advantages, loss divided by a constant generation budget.
- k3 KL estimator: Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html).
- TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (https://fengyao.notion.site/off-policy-rl): truncated importance sampling between the rollout
  engine's and the trainer's logprobs of the same tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

LossAggregation = Literal["token-mean", "seq-mean", "dr-grpo"]
LOSS_AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean", "dr-grpo")


def _check_groups(rewards: torch.Tensor, group_size: int) -> int:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [num_groups * group_size], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 for group-relative advantages (got {group_size}): "
            "with one sample per prompt the advantage is always 0 and nothing is learned."
        )
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size}: "
            "rewards must be num_groups * group_size long, each group contiguous."
        )
    return rewards.numel() // group_size


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024, eq. 3 / outcome supervision).

    For the ``G = group_size`` completions ``r_1..r_G`` of one prompt::

        A_i = (r_i - mean(r)) / (std(r) + eps)      scale_std=True   (GRPO)
        A_i =  r_i - mean(r)                         scale_std=False  (Dr. GRPO, Liu et al. 2025)

    ``std`` is the unbiased sample standard deviation (``torch.std``, divisor ``G - 1``).
    ``rewards`` is ``[num_groups * group_size]`` with each group contiguous; the result has the
    same shape and is computed in float32 (or float64 for float64 input).
    """
    num_groups = _check_groups(rewards, group_size)
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(num_groups, group_size)
    centered = r - r.mean(dim=1, keepdim=True)
    if scale_std:
        centered = centered / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    # A group of equal rewards has advantage exactly 0. In float32 its mean can be one ulp off
    # (mean of eight 0.1s != 0.1), and dividing that by std + eps (std ~1e-9) would push the whole
    # group up or down by ~1e-2.
    equal = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)
    return torch.where(equal, torch.zeros_like(centered), centered).reshape(-1)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``BoolTensor[num_groups]``: True where every completion of the group got the same reward.

    Such groups have all-zero advantages and contribute no policy gradient; DAPO's dynamic
    sampling (Yu et al. 2025, sec. 3.2) drops them from the batch. Exact equality (max == min),
    not a float tolerance.
    """
    num_groups = _check_groups(rewards, group_size)
    r = rewards.view(num_groups, group_size)
    return r.amax(dim=1) == r.amin(dim=1)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, sec. 3.4, eq. 13), per completion.

    With ``L_max = max_new_tokens`` (the generation cap) and ``L_cache = buffer``::

        R_len(y) = 0                                   |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache  L_max - L_cache < |y| <= L_max

    a linear penalty over the last ``buffer`` tokens before the cap that reaches -1 at the cap
    (the full penalty of a completion cut there). ``buffer = 0``: no penalty. ``lengths`` holds
    completion token counts; the result is float32 of the same shape.
    """
    if buffer < 0 or buffer > max_new_tokens:
        raise ValueError(
            f"the overlong buffer must lie in [0, max_new_tokens={max_new_tokens}], got {buffer}"
        )
    lengths = lengths.to(torch.float32)
    if buffer == 0:
        return torch.zeros_like(lengths)
    start = max_new_tokens - buffer
    return torch.clamp((start - lengths) / buffer, min=-1.0, max=0.0)


def shape_rewards(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    *,
    max_new_tokens: int,
    overlong_buffer: int = 0,
    overlong_factor: float = 1.0,
    truncated_reward: float | None = None,
) -> torch.Tensor:
    """The rewards the advantages are computed from: the task's, with the length remedies.

    A reward that reads only the first final answer (GSM8K's ``#### n``) scores whatever follows it
    too, so a group's rewarded samples teach the policy to keep writing to the cap. Two remedies,
    each optional (the defaults change nothing):

    - ``truncated_reward``: a completion cut at ``max_new_tokens`` gets this reward instead of its
      task reward (0.0: a cut answer never pays);
    - ``overlong_buffer`` > 0: ``overlong_factor *`` :func:`overlong_penalty` is added (DAPO).
    """
    shaped = rewards.to(torch.float32).clone()
    if truncated_reward is not None:
        shaped = torch.where(truncated.bool(), torch.full_like(shaped, float(truncated_reward)), shaped)
    if overlong_buffer:
        shaped = shaped + overlong_factor * overlong_penalty(lengths, max_new_tokens, overlong_buffer)
    return shaped


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation,
    max_len: int | None = None,
    *,
    global_count: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar; ``mask`` is 1 on the tokens that count.

    With ``l_{i,t}`` the per-token loss, ``m_{i,t}`` the mask and ``|o_i| = sum_t m_{i,t}``:

    - ``"token-mean"`` (DAPO, Yu et al. 2025, eq. 12): every token weighs the same::

          L = sum_{i,t} m_{i,t} l_{i,t} / sum_{i,t} m_{i,t}

    - ``"seq-mean"`` (GRPO, Shao et al. 2024, eq. 3): mean over sequences of per-sequence token
      means, so tokens of long completions weigh less::

          L = (1/B) sum_i (1/|o_i|) sum_t m_{i,t} l_{i,t}

      (a sequence with no masked-in tokens contributes 0 but still counts in ``B``, as in TRL).
    - ``"dr-grpo"`` (Liu et al. 2025, sec. 3.1): divide by a constant, the generation budget
      ``max_len`` (``max_new_tokens``), removing the length bias of both means above::

          L = sum_{i,t} m_{i,t} l_{i,t} / (B * max_len)

    ``global_count`` (optional) replaces the local denominator when a minibatch is split into
    microbatches: pass the minibatch's total masked token count for ``token-mean`` or its number
    of sequences for ``seq-mean`` / ``dr-grpo``; the microbatch losses then SUM to the minibatch
    loss (instead of having to be averaged with token-count weights).
    """
    if per_token_loss.shape != mask.shape or per_token_loss.dim() != 2:
        raise ValueError(
            f"per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    if mode == "token-mean":
        denom = mask.sum().clamp(min=1.0) if global_count is None else max(global_count, 1.0)
        return masked.sum() / denom
    if mode == "seq-mean":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        num_seqs = per_token_loss.shape[0] if global_count is None else global_count
        return per_seq.sum() / max(num_seqs, 1)
    if mode == "dr-grpo":
        if max_len is None or max_len <= 0:
            raise ValueError(
                "loss aggregation 'dr-grpo' needs max_len, the generation budget (max_new_tokens) "
                f"as a positive constant; got {max_len!r}"
            )
        num_seqs = per_token_loss.shape[0] if global_count is None else global_count
        return masked.sum() / (max(num_seqs, 1) * max_len)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(values * mask) / max(sum(mask), 1)`` (a token-weighted mean; 0 for an empty mask)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(f"advantages [{advantages.shape[0]}] do not match batch size {like.shape[0]}")
        return advantages.unsqueeze(1)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B] or [B, T] = {tuple(like.shape)}")
    return advantages


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip surrogate with DAPO's decoupled clip range (clip-higher, Yu et al. 2025, eq. 10).

    With the importance ratio ``r = exp(logprobs - old_logprobs)`` and advantage ``A``
    (``[B]`` broadcast over tokens, or ``[B, T]``)::

        loss_t = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)

    Returns ``(per_token_loss [B, T], clipped_mask [B, T] bool)``; ``clipped_mask`` is True where
    the clipped branch is the active one and differs from the unclipped one (``r > 1 + eps_high``
    with ``A > 0`` or ``r < 1 - eps_low`` with ``A < 0``): there the token gets no gradient. Its
    masked mean is the clip fraction.
    """
    adv = _broadcast_advantages(advantages, logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token_loss = -torch.minimum(unclipped, clipped)
    clipped_mask = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
    return per_token_loss, clipped_mask


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman 2020, "Approximating KL Divergence")::

        k3 = exp(ref - lp) - (ref - lp) - 1       (>= 0, unbiased for samples from pi)

    This is the KL penalty of GRPO (Shao et al. 2024, eq. 4). Not clamped: a huge
    ``ref - lp`` overflows to ``inf`` honestly instead of being silently capped.
    """
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def truncated_importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance sampling weights (TIS, Yao et al. 2025), detached::

        w_t = min(exp(old_logprobs - rollout_logprobs), cap)

    The rollout engine (SGLang, bf16 kernels, sampling at temperature T) and the trainer
    compute slightly different probabilities for the same tokens, so samples are off-policy
    w.r.t. the trainer's old policy; multiplying the per-token policy-gradient loss by ``w``
    corrects this, and the cap bounds the variance.
    """
    if cap <= 0:
        raise ValueError(f"TIS cap must be positive, got {cap}")
    return torch.exp(old_logprobs - rollout_logprobs).clamp(max=cap).detach()


def rollout_mismatch(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the trainer's log-probabilities of the sampled tokens are from the rollout engine's
    (masked token statistics, detached; ``grpo_loss`` passes the old policy's, those of the weights
    the rollout was synced from). With ``d = logprobs - rollout_logprobs`` per token and the
    tokens drawn from the rollout policy, the two estimators of KL(rollout || trainer) are::

        mismatch_k1 = mean(-d)                 (unbiased, can be negative on a batch)
        mismatch_k3 = mean(exp(d) - 1 - d)     (unbiased, never negative; Schulman's k3)

    and ``mismatch_exp_abs`` / ``mismatch_exp_abs_median`` are the mean and median of ``exp|d|``
    (NeMo-RL's gates for low-precision rollouts: k3 < 0.003, median exp|d| < 1.1)."""
    with torch.no_grad():  # no host sync: a batch's median over its masked tokens by nanmedian
        d = (logprobs - rollout_logprobs).to(torch.float64)
        m = mask.to(torch.float64)
        return {
            "mismatch_k1": masked_mean(-d, m),
            "mismatch_k3": masked_mean(torch.expm1(d) - d, m),
            "mismatch_exp_abs": masked_mean(torch.exp(d.abs()), m),
            "mismatch_exp_abs_median": torch.where(m > 0, d.abs(), d.new_full((), float("nan")))
            .nanmedian()
            .exp(),
        }


MaskingLevel = Literal["none", "sequence", "geometric"]


def mismatch_masking(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    level: MaskingLevel,
    high: float,
) -> torch.Tensor:
    """Masked importance sampling (MIS): which sequences to keep (``[B]``, 1.0 or 0.0, detached)
    when the trainer and the rollout disagree too much on a whole completion. The ratio of the
    completion's probabilities, with ``d`` as in :func:`rollout_mismatch` summed over its tokens::

        sequence:  rho = exp(sum_t d_t)          geometric:  rho = exp(mean_t d_t)

    keeps a sequence when ``1 / high <= rho <= high`` ("When Speed Kills Stability", 2025; slime's
    --tis-level sequence|geometric, as masking rather than weighting). ``none`` keeps all."""
    if level == "none":
        return torch.ones(logprobs.shape[0], dtype=logprobs.dtype, device=logprobs.device)
    if high <= 1.0:
        raise ValueError(f"the masking bound must be > 1, got {high}")
    with torch.no_grad():
        m = mask.to(torch.float64)
        total = ((logprobs - rollout_logprobs).to(torch.float64) * m).sum(-1)
        log_rho = total if level == "sequence" else total / m.sum(-1).clamp(min=1.0)
        bound = math.log(high)
        return ((log_rho >= -bound) & (log_rho <= bound)).to(logprobs.dtype)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    rollout_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.0,
    entropy_coef: float = 0.0,
    tis_cap: float | None = None,
    loss_agg: LossAggregation = "token-mean",
    max_len: int | None = None,
    global_count: float | None = None,
    mis: MaskingLevel = "none",
    mis_high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective for one (micro)batch; returns ``(scalar loss, detached metrics)``.

    Per token::

        l_t = w_t * clip_loss_t + beta * k3_t - entropy_coef * H_t

    with ``clip_loss`` from :func:`clipped_surrogate`, ``w`` the TIS weights
    (:func:`truncated_importance_weights`, only when ``tis_cap`` is set, which needs
    ``rollout_logprobs``), ``k3`` from :func:`kl_k3` (only when ``beta > 0``, which needs
    ``ref_logprobs``), ``H`` the per-token entropy (only when ``entropy_coef > 0``). The scalar is
    :func:`aggregate_loss` of ``l`` with ``loss_agg`` (``max_len`` for ``"dr-grpo"``,
    ``global_count`` for microbatching).

    Metrics (masked token means, detached): ``clip_frac`` (fraction of tokens whose clipped
    branch is active), ``clip_frac_low``, ``clip_frac_high``, ``ratio_mean`` (``exp(lp - old)``),
    ``kl`` (k3 against the reference; NaN when no ``ref_logprobs`` given), ``entropy`` (NaN when
    no ``entropy`` given), ``tis_weight_mean`` (1.0 when TIS is off), ``tis_clipped_frac`` (the
    share of tokens whose TIS weight the cap cut; 0 when TIS is off), ``pg_loss`` (the
    aggregated clip loss alone); with ``rollout_logprobs``: :func:`rollout_mismatch`'s four, and
    ``mis_masked_frac`` (the share of sequences :func:`mismatch_masking` drops; ``mis`` other than
    "none" needs ``rollout_logprobs``, and the dropped sequences' tokens leave the loss).
    """
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logprobs (the frozen reference policy's logprobs)")
    if entropy_coef != 0 and entropy is None:
        raise ValueError(f"entropy_coef={entropy_coef} needs the per-token entropy")
    if tis_cap is not None and rollout_logprobs is None:
        raise ValueError(f"tis_cap={tis_cap} needs rollout_logprobs (the rollout engine's logprobs)")

    if mis != "none" and rollout_logprobs is None:
        raise ValueError(f"mis={mis!r} needs rollout_logprobs (the rollout engine's logprobs)")

    mask = completion_mask.to(logprobs.dtype)
    observed = mask
    if rollout_logprobs is not None:  # the old policy's gap to the rollout, as TIS measures it
        keep = mismatch_masking(old_logprobs.detach(), rollout_logprobs, mask, mis, mis_high)
        mask = mask * keep[:, None]
    clip_loss, clipped = clipped_surrogate(
        logprobs, old_logprobs, advantages, eps_low=eps_low, eps_high=eps_high
    )

    if tis_cap is not None:
        tis_weights = truncated_importance_weights(old_logprobs, rollout_logprobs, tis_cap)
        pg_per_token = clip_loss * tis_weights
    else:
        tis_weights = None
        pg_per_token = clip_loss
    per_token = pg_per_token

    kl = kl_k3(logprobs, ref_logprobs) if ref_logprobs is not None else None
    if beta > 0:
        per_token = per_token + beta * kl
    if entropy_coef != 0:
        per_token = per_token - entropy_coef * entropy

    loss = aggregate_loss(per_token, mask, loss_agg, max_len, global_count=global_count)

    with torch.no_grad():
        nan = torch.tensor(float("nan"), device=logprobs.device)
        adv = _broadcast_advantages(advantages, logprobs)
        ratio = torch.exp(logprobs - old_logprobs)
        metrics = {
            "clip_frac": masked_mean(clipped.to(mask.dtype), mask),
            "clip_frac_low": masked_mean(((ratio < 1.0 - eps_low) & (adv < 0)).to(mask.dtype), mask),
            "clip_frac_high": masked_mean(((ratio > 1.0 + eps_high) & (adv > 0)).to(mask.dtype), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "kl": masked_mean(kl, mask) if kl is not None else nan,
            "entropy": masked_mean(entropy.to(mask.dtype), mask) if entropy is not None else nan,
            "tis_weight_mean": masked_mean(tis_weights, mask)
            if tis_weights is not None
            else nan.new_ones(()),
            # the share of the loss's tokens whose weight the cap cut (0 when TIS is off)
            "tis_clipped_frac": masked_mean(
                (torch.exp(old_logprobs - rollout_logprobs) > tis_cap).to(mask.dtype), mask
            )
            if tis_cap is not None
            else nan.new_zeros(()),
            "pg_loss": aggregate_loss(pg_per_token, mask, loss_agg, max_len, global_count=global_count),
        }
        if rollout_logprobs is not None:  # over every completion token, masked or not
            metrics.update(rollout_mismatch(old_logprobs, rollout_logprobs, observed))
            rows = (observed.sum(-1) > 0).to(keep.dtype)
            metrics["mis_masked_frac"] = ((1.0 - keep) * rows).sum() / rows.sum()  # NaN: no completion
        metrics = {k: v.detach() for k, v in metrics.items()}
    return loss, metrics


@dataclass(frozen=True)
class GRPOLoss:
    """:func:`grpo_loss` with its hyperparameters bound: the ``loss_fn(logprobs, entropy, batch,
    extras)`` every backend's ``train_step`` calls per micro-batch. ``extras`` carries the batch's
    ``advantages``, ``rollout_logprobs``, ``global_count`` and, when computed, ``old_logprobs`` (else
    the detached current ones: one on-policy step) and ``ref_logprobs``."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0
    entropy_coef: float = 0.0
    tis_cap: float | None = None
    loss_agg: LossAggregation = "token-mean"
    max_len: int | None = None
    mis: MaskingLevel = "none"
    mis_high: float = 2.0

    @classmethod
    def from_config(cls, algo, max_new_tokens: int) -> GRPOLoss:
        """From an :class:`~slime_gb10.grpo.config.AlgoConfig` and the rollout's token budget."""
        fields = ("eps_low", "eps_high", "beta", "entropy_coef", "tis_cap", "loss_agg", "mis", "mis_high")
        return cls(**{name: getattr(algo, name) for name in fields}, max_len=max_new_tokens)

    def __call__(self, logprobs, entropy, batch, extras) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        old = extras.get("old_logprobs")
        return grpo_loss(
            logprobs,
            logprobs.detach() if old is None else old,
            extras["advantages"],
            batch.completion_mask,
            rollout_logprobs=extras["rollout_logprobs"],
            ref_logprobs=extras.get("ref_logprobs"),
            entropy=entropy,
            global_count=extras["global_count"],
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
        )


# The losses a run can name (``algo.loss``): a new one (GSPO, say) is a class here with a
# ``from_config(algo, max_new_tokens)`` and a ``__call__`` like GRPOLoss's, plus its config
# value; the trainer and the backends never name a loss.
LOSSES = {"grpo": GRPOLoss}


def build_loss(algo, max_new_tokens: int):
    """The ``loss_fn`` of an :class:`~slime_gb10.grpo.config.AlgoConfig` (``algo.loss``)."""
    return LOSSES[algo.loss].from_config(algo, max_new_tokens)
