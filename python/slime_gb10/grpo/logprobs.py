"""Token logprobs and entropy from the last hidden state, chunked over the vocabulary.

The GRPO loss needs ``log p(token)`` (and optionally the entropy) of every completion token.
The naive way, ``log_softmax(hidden @ W.T / T)``, materialises ``[tokens, vocab]`` logits in
FP32: for Qwen's vocabulary of 151,936 and 16k tokens that is 9.7 GB, plus as much again for the
softmax gradient. Here the vocabulary is processed in chunks of ``chunk_size`` rows of the LM
head (and the tokens in blocks of ``token_chunk_size``) with an online logsumexp (Milakov &
Gimelshein 2018, "Online normalizer calculation for softmax"; the same running max/sum as
FlashAttention), so the extra memory is ``O(token_chunk_size * chunk_size)``:

    running max   m   <- max(m, max_j z_j)
    running sum   s   <- s * exp(m_old - m) + sum_j exp(z_j - m)
    running       q   <- (q + s_old (m_old - m)) * exp(m_old - m) + sum_j exp(z_j - m) (z_j - m)
    logsumexp         =  m + log s
    log p(target)     =  z_target - logsumexp
    entropy H         = -sum_j p_j log p_j = log s - q / s

with ``z = (hidden @ W.T + b) / T`` (temperature ``T``, as the rollout engine samples). The
backward pass (a custom :class:`torch.autograd.Function`) recomputes each chunk's logits from
the saved hidden state, LM head and per-token logsumexp/entropy, using

    d log p_target / d z_j = 1[j = target] - p_j
    d H / d z_j            = -p_j (log p_j + H)

Numerics: the matmuls (logits and both gradients) run in :func:`matmul_dtype` -- the autocast
dtype inside ``torch.autocast`` (as an autocast ``nn.Linear`` LM head would), else the promoted
dtype of hidden and weight (bf16 logits for a bf16 model) -- and everything after them in float32
(float64 for float64 input, which the tests use for ``gradcheck``). Gradients come back in the
dtype of each input (fp32 master weights get fp32 gradients). The tests compare it with a
pure-torch reference of full ``[N, V]`` logits (``tests/grpo/test_logprobs.py``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    mm: torch.dtype,
    acc: torch.dtype,
) -> torch.Tensor:
    """``(hidden @ weight.T + bias) / temperature`` as a fresh ``acc`` tensor (callers modify it in place)."""
    z = (hidden.to(mm) @ weight.to(mm).T).to(acc)
    if bias is not None:
        z.add_(bias.to(acc))
    if temperature != 1.0:
        z.div_(temperature)
    return z


def matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype of the logits matmul: the autocast dtype inside ``torch.autocast``, else the promoted input dtype."""
    device_type = hidden.device.type
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def chunk_statistics(h, w, b, targets, first: int, temperature: float, mm: torch.dtype, acc: torch.dtype):
    """One block of tokens against one chunk of the vocabulary (rows ``first ...`` of the LM head):
    the chunk's max logit ``c``, ``sum exp(z - c)``, ``sum exp(z - c) (z - c)`` and the logit of
    each target inside the chunk (0 elsewhere), each ``[tokens]`` in ``acc``."""
    z = _chunk_logits(h, w, b, temperature, mm, acc)
    inside = (targets >= first) & (targets < first + z.shape[1])
    local = (targets - first).clamp(0, z.shape[1] - 1)
    target_logit = torch.where(inside, z.gather(1, local[:, None]).squeeze(1), 0.0)
    peak = z.amax(dim=1)
    shifted = z - peak[:, None]
    e = torch.exp(shifted)
    return peak, e.sum(dim=1), (e * shifted).sum(dim=1), target_logit


def chunk_gradient(
    h,
    w,
    b,
    targets,
    first: int,
    lse,
    entropy,
    grad_logprobs,
    grad_entropy,
    temperature: float,
    mm,
    acc,
    with_bias,
):
    """d loss / d logits of one block of tokens against one vocabulary chunk, in ``mm`` (and summed
    over the tokens in ``acc`` when ``with_bias``): ``(1[j = target] - p_j) * grad_logprobs -
    p_j (log p_j + H) * grad_entropy``, over the temperature (either gradient may be None)."""
    logp = _chunk_logits(h, w, b, temperature, mm, acc) - lse[:, None]
    p = torch.exp(logp)
    if grad_logprobs is not None:
        inside = (targets >= first) & (targets < first + p.shape[1])
        local = (targets - first).clamp(0, p.shape[1] - 1)
        g = (p * -grad_logprobs[:, None]).scatter_add(
            1, local[:, None], torch.where(inside, grad_logprobs, 0.0)[:, None]
        )
    else:
        g = torch.zeros_like(p)
    if grad_entropy is not None:
        g = g - (logp + entropy[:, None]) * p * grad_entropy[:, None]
    if temperature != 1.0:
        g = g / temperature
    return g.to(mm), (g.sum(dim=0) if with_bias else None)


def _merge_running(m, s, q, chunk_m, chunk_s, chunk_q):
    """The online logsumexp's running ``(q, s, m)`` after one more chunk's ``(chunk_m, chunk_s,
    chunk_q)`` (the formulas of the module docstring)."""
    new_m = torch.maximum(m, chunk_m)
    old, new = torch.exp(m - new_m), torch.exp(chunk_m - new_m)
    # sum exp(z - new_m)(z - new_m) = sum exp(z - c) (z - c + c - new_m) exp(c - new_m)
    q = (q + s * (m - new_m)) * old + (chunk_q + chunk_s * (chunk_m - new_m)) * new
    return q, s * old + chunk_s * new, new_m


@functools.cache
def _compiled(backend: str):
    """:func:`chunk_statistics` and :func:`chunk_gradient` through ``torch.compile`` (dynamic
    shapes: the last blocks are shorter): inductor fuses each into the matmul and one or two
    kernels, instead of eager's ~10 passes over FP32 copies of the ``[tokens, chunk]`` logits (in
    a training step of shape B on an H100 those passes were ~15% of the step, issue #27)."""
    return (
        torch.compile(chunk_statistics, dynamic=True, backend=backend),
        torch.compile(chunk_gradient, dynamic=True, backend=backend),
    )


class _ChunkedLogprobsEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *args):  # the arguments of _forward, after ctx
        with torch.autocast(args[0].device.type, enabled=False):
            return _ChunkedLogprobsEntropy._forward(ctx, *args)

    @staticmethod
    def _forward(
        ctx,
        hidden,
        weight,
        bias,
        targets,
        temperature,
        chunk_size,
        token_chunk_size,
        with_entropy,
        mm,
        backend,
        group,
    ):
        acc = _acc_dtype(mm)
        statistics = _compiled(backend)[0] if backend else chunk_statistics
        n = hidden.shape[0]
        vocab = weight.shape[0]
        # a vocabulary-parallel head: this rank holds rows [offset, offset + vocab) of the whole one
        offset = vocab * torch.distributed.get_rank(group) if group is not None else 0
        head = weight.to(mm)  # cast once, not once per block
        # per token: the running max, sum, entropy sum and target logit over this rank's vocabulary
        stats = torch.empty(4, n, dtype=acc, device=hidden.device)
        for t0 in range(0, n, token_chunk_size):
            t1 = min(n, t0 + token_chunk_size)
            h, tgt = hidden[t0:t1], targets[t0:t1]
            m = s = q = target_logit = None
            for v0 in range(0, vocab, chunk_size):
                v1 = min(vocab, v0 + chunk_size)
                b = None if bias is None else bias[v0:v1]
                chunk_m, chunk_s, chunk_q, chunk_target = statistics(
                    h, head[v0:v1], b, tgt, offset + v0, temperature, mm, acc
                )
                if m is None:
                    m, s, q, target_logit = chunk_m, chunk_s, chunk_q, chunk_target
                    continue
                target_logit = target_logit + chunk_target  # each target is in exactly one chunk
                q, s, m = _merge_running(m, s, q, chunk_m, chunk_s, chunk_q)
            stats[:, t0:t1] = torch.stack([m, s, q, target_logit])
        if group is not None:  # the ranks' vocabularies are chunks of one: merged the same way
            ranks = [torch.empty_like(stats) for _ in range(torch.distributed.get_world_size(group))]
            torch.distributed.all_gather(ranks, stats, group=group)
            stats = ranks[0]
            for other in ranks[1:]:
                q, s, m = _merge_running(stats[0], stats[1], stats[2], other[0], other[1], other[2])
                stats = torch.stack([m, s, q, stats[3] + other[3]])
        m, s, q, target_logit = stats
        log_s = torch.log(s)
        lse = m + log_s
        logprobs = target_logit - lse
        entropy = log_s - q / s if with_entropy else lse.new_empty(0)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.offset, ctx.group = offset, group
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.token_chunk_size = token_chunk_size
        ctx.with_entropy = with_entropy
        ctx.mm = mm
        ctx.backend = backend
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy):
        with torch.autocast(grad_logprobs.device.type if grad_logprobs is not None else "cpu", enabled=False):
            return _ChunkedLogprobsEntropy._backward(ctx, grad_logprobs, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if not ctx.with_entropy or (grad_entropy is not None and grad_entropy.numel() == 0):
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return (None,) * 11
        acc, mm = lse.dtype, ctx.mm
        gradient = _compiled(ctx.backend)[1] if ctx.backend else chunk_gradient
        n, vocab = hidden.shape[0], weight.shape[0]
        temperature, cs, tcs = ctx.temperature, ctx.chunk_size, ctx.token_chunk_size
        head = weight.to(mm)
        hidden_mm = hidden.to(mm)
        glp_all = None if grad_logprobs is None else grad_logprobs.to(acc)
        gent_all = None if grad_entropy is None else grad_entropy.to(acc)
        grad_hidden = (
            torch.zeros(n, hidden.shape[1], dtype=acc, device=hidden.device) if need_hidden else None
        )
        grad_weight = torch.empty_like(weight) if need_weight else None
        grad_bias = torch.empty_like(bias) if need_bias else None
        for v0 in range(0, vocab, cs):
            v1 = min(vocab, v0 + cs)
            w = head[v0:v1]
            b = None if bias is None else bias[v0:v1]
            gw = (
                torch.zeros(v1 - v0, weight.shape[1], dtype=acc, device=weight.device)
                if need_weight
                else None
            )
            gb = torch.zeros(v1 - v0, dtype=acc, device=weight.device) if need_bias else None
            for t0 in range(0, n, tcs):
                t1 = min(n, t0 + tcs)
                h = hidden_mm[t0:t1]
                g_mm, g_sum = gradient(
                    h,
                    w,
                    b,
                    targets[t0:t1],
                    ctx.offset + v0,
                    lse[t0:t1],
                    entropy[t0:t1] if gent_all is not None else None,
                    None if glp_all is None else glp_all[t0:t1],
                    None if gent_all is None else gent_all[t0:t1],
                    temperature,
                    mm,
                    acc,
                    need_bias,
                )
                if need_hidden:
                    grad_hidden[t0:t1] += (g_mm @ w).to(acc)
                if need_weight:
                    gw += (g_mm.T @ h).to(acc)
                if need_bias:
                    gb += g_sum
            if need_weight:
                grad_weight[v0:v1] = gw.to(weight.dtype)
            if need_bias:
                grad_bias[v0:v1] = gb.to(bias.dtype)
        if need_hidden:
            if ctx.group is not None:
                # every rank holds the same hidden states and the gradient through its own vocabulary
                # rows: the sum is theirs (Megatron's column-parallel LM head all-reduces it alike)
                torch.distributed.all_reduce(grad_hidden, group=ctx.group)
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None, None, None


def chunked_logprobs_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    with_entropy: bool = True,
    lm_head_bias: torch.Tensor | None = None,
    token_chunk_size: int = 4096,
    compile_backend: str | None = None,
    vocab_parallel_group=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(hidden @ W.T / T)[target]`` and the entropy per row, without ``[N, V]`` logits.

    ``hidden`` ``[N, H]``, ``lm_head_weight`` ``[V, H]``, ``targets`` ``[N]`` (int, in ``[0, V)``).
    ``hidden`` and the weight may differ in dtype (e.g. bf16 activations, fp32 master weights) and
    the call may sit inside ``torch.autocast``: see :func:`matmul_dtype`.
    Returns ``(logprobs [N], entropy [N] or None)`` in float32 (float64 for a float64 matmul).
    Differentiable w.r.t. ``hidden``, ``lm_head_weight`` and ``lm_head_bias`` (first order); the
    backward recomputes the logits chunk by chunk. Peak extra memory is about
    ``4 * token_chunk_size * chunk_size`` floats (plus the gradients themselves), independent of ``V``.
    ``compile_backend`` (``"inductor"`` on a GPU): each block's arithmetic through ``torch.compile``
    (:func:`chunk_statistics`, :func:`chunk_gradient`); None: eager.
    ``vocab_parallel_group`` (a ``torch.distributed`` group; Megatron-core's tensor-parallel one):
    the LM head is split over its ranks by vocabulary, rank ``r`` holding rows ``[r V, (r + 1) V)``
    of the whole head and every rank the same ``hidden`` and ``targets`` (ids of the whole
    vocabulary). Each rank reduces its rows to the running statistics above, which merge over the
    ranks as chunks do (one all-gather of ``4 N`` floats); the backward needs only the merged
    logsumexp and entropy, and all-reduces the gradient of ``hidden``. Every rank gets the
    logprobs and entropy of the whole vocabulary; the weight gradient is of its own rows.
    """
    if hidden.dim() != 2 or lm_head_weight.dim() != 2 or hidden.shape[1] != lm_head_weight.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [N, H] and lm_head_weight {tuple(lm_head_weight.shape)} [V, H]"
        )
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets {tuple(targets.shape)} must be [N] = [{hidden.shape[0]}]")
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (greedy decoding has no logprobs to train on), got {temperature}"
        )
    if chunk_size <= 0 or token_chunk_size <= 0:
        raise ValueError("chunk_size and token_chunk_size must be positive")
    vocab = lm_head_weight.shape[0]
    if lm_head_bias is not None and lm_head_bias.shape != (vocab,):
        raise ValueError(f"lm_head_bias {tuple(lm_head_bias.shape)} must be [V] = [{vocab}]")
    mm = matmul_dtype(hidden, lm_head_weight)
    targets = targets.long()
    group = vocab_parallel_group
    whole = vocab * (torch.distributed.get_world_size(group) if group is not None else 1)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= whole):
        raise ValueError(
            f"targets must be token ids in [0, {whole}); got min {int(targets.min())} max {int(targets.max())}"
        )
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=_acc_dtype(mm)) + hidden.sum() * 0
        return empty, (empty.clone() if with_entropy else None)
    logprobs, entropy = _ChunkedLogprobsEntropy.apply(
        hidden,
        lm_head_weight,
        lm_head_bias,
        targets,
        float(temperature),
        chunk_size,
        token_chunk_size,
        with_entropy,
        mm,
        compile_backend,
        vocab_parallel_group,
    )
    return logprobs, (entropy if with_entropy else None)


def sequence_logprobs_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    input_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    **options,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position logprobs ``[B, T]`` of ``input_ids`` from the last hidden states ``[B, T, H]``.

    Token ``t`` is predicted from position ``t - 1`` (``TokenBatch`` convention), so row ``t`` of
    the output is ``log p(input_ids[:, t] | hidden[:, t - 1])``. Only positions where
    ``completion_mask`` is nonzero are computed (prompt and padding tokens cost nothing); the
    others, and position 0, are 0. Differentiable like :func:`chunked_logprobs_entropy`, which
    takes ``options`` (``temperature``, ``with_entropy``, ``lm_head_bias``, the chunk sizes). Both
    policy backends compute their logprobs through it.
    """
    if hidden.dim() != 3 or input_ids.shape != hidden.shape[:2] or completion_mask.shape != input_ids.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [B, T, H] with input_ids {tuple(input_ids.shape)} and "
            f"completion_mask {tuple(completion_mask.shape)} both [B, T]"
        )
    batch, length = input_ids.shape
    selected = completion_mask[:, 1:].bool()
    rows = hidden[:, :-1][selected]
    targets = input_ids[:, 1:][selected]
    logprobs, entropy = chunked_logprobs_entropy(rows, lm_head_weight, targets, **options)

    def scatter(values: torch.Tensor) -> torch.Tensor:
        full = values.new_zeros(batch, length - 1).masked_scatter(selected, values)
        return F.pad(full, (1, 0))

    return scatter(logprobs), (scatter(entropy) if entropy is not None else None)


#: Config fields of Hugging Face models whose logits are NOT ``hidden @ lm_head.weight.T`` (+ bias):
#: Granite divides by ``logits_scaling``, Gemma 2/3 soft-cap with ``final_logit_softcapping``,
#: Cohere multiplies by ``logit_scale``. The chunked path above would silently compute other
#: logprobs than the model's own forward (and the rollout engine's).
_NON_LINEAR_HEAD_FIELDS = {"logits_scaling": 1.0, "final_logit_softcapping": None, "logit_scale": None}


def unsupported_lm_head_features(config) -> list[str]:
    """``["logits_scaling=8.0", ...]``: what in ``config`` the chunked LM-head path does not model."""
    found = []
    for field, neutral in _NON_LINEAR_HEAD_FIELDS.items():
        value = getattr(config, field, neutral)
        if value not in (neutral, None, 1.0):
            found.append(f"{field}={value}")
    return found
