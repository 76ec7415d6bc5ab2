"""Rollout speed with and without each of the engine's decode-step choices, in one process.

Variants, each a fresh engine (compile, capture and one warm-up rollout before the timed one):
the torch sampler or the Triton kernel (``engines/torch/sampling_kernel.py``), attention over the whole
static cache or over buckets of the written slots (``torch_engine.ATTENTION_BUCKET``), SDPA or the
grouped-query decode kernel (``engines/torch/decode_attention.py``), the rotary embedding and cache writes
as their own ops or inside that kernel (``decode_step``), the narrow projections as one GEMM or
over slices of K (``static_decoder.split_k_linear``); by default only the last choice, the rest
with ROLLOUT_VARIANTS_SLOW=1, which also adds
FlexAttention, inductor's GEMM autotuning and session 19's attention formulations (SDPA forced to
memory-efficient attention, GQA as two batched matmuls). Prints wall seconds and the mean |logprob| difference
of the first 32 tokens against the first variant (random-init models sample from nearly uniform
distributions, so a last-bit change of the logits changes the token: this column only shows the
variants that compute exactly the same).

    python benchmarks/grpo/dev/rollout_variants.py WORK_DIR/model-B --prompts 160 --new-tokens 512
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from unittest import mock

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/grpo: profile_rollout
from profile_rollout import new_engine, rollout_setup, timed_generate

from slime_gb10.grpo.engines.torch import decode_attention, sampling_kernel, static_decoder
from slime_gb10.grpo.engines.torch import engine as torch_engine

WHOLE_CACHE = 1 << 30  # a bucket longer than any cache: attention over the whole buffer
SDPA = static_decoder.StaticDecoder.attend


def efficient(q, keys, values, mask, scale):
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return SDPA(q, keys, values, mask, scale)


def grouped(q, keys, values, mask, scale, fp32_scores=False):
    """One new position per row (T = 1): the G query heads of each KV head are the rows of one
    batched matmul with that head's cache (scores in BF16 or, with ``fp32_scores``, FP32)."""
    b, h, t, d = q.shape
    hkv, length = keys.shape[1], keys.shape[2]
    if t != 1:  # prefill: the SDPA path
        return SDPA(q, keys, values, mask, scale)
    g = h // hkv
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b * hkv, g, d)
    if fp32_scores:
        scores = torch.bmm(qg, keys.reshape(b * hkv, length, d).transpose(1, 2), out_dtype=torch.float32)
    else:
        scores = torch.bmm(qg, keys.reshape(b * hkv, length, d).transpose(1, 2)).float()
    scores = (scores * scale).view(b, hkv, g, length).masked_fill(~mask.view(b, 1, 1, length), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype).view(b * hkv, g, length)
    return torch.bmm(probs, values.reshape(b * hkv, length, d)).view(b, h, 1, d)


def flex_decode(q, keys, values, mask, scale):
    """A decode step's attention through FlexAttention (inductor's split-KV decoding kernel packs the
    query heads of one KV head together); the prefill and eager runs keep SDPA."""
    if q.shape[2] != 1 or not torch.compiler.is_compiling():
        return SDPA(q, keys, values, mask, scale)
    from torch.nn.attention.flex_attention import flex_attention

    valid = mask[:, 0, 0, :]

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(valid[b, kv_idx], score, -float("inf"))

    return flex_attention(q, keys, values, score_mod=score_mod, scale=scale, enable_gqa=True)


@contextlib.contextmanager
def variant(
    bucket: int,
    kernel: bool,
    gqa_kernel: bool = True,
    fused_step: bool = True,
    autotune: bool = False,
    attend=SDPA,
    o_splits: int = static_decoder.O_SPLIT_K,
    down_splits: int = static_decoder.DOWN_SPLIT_K,
    qkv_splits: int = static_decoder.QKV_SPLIT_K,
):
    """The engine's choices set for one variant (module attributes patched, restored on exit)."""
    import torch._inductor.config as inductor_config

    patches = [
        (torch_engine, "ATTENTION_BUCKET", bucket),
        (inductor_config, "max_autotune_gemm", autotune),
        (static_decoder.StaticDecoder, "attend", staticmethod(attend)),
        (static_decoder, "O_SPLIT_K", o_splits),
        (static_decoder, "DOWN_SPLIT_K", down_splits),
        (static_decoder, "QKV_SPLIT_K", qkv_splits),
    ]
    if not kernel:  # the torch sampler
        patches.append((sampling_kernel, "applies", lambda logits, params: False))
    if not gqa_kernel:  # one-token steps through StaticDecoder.attend (SDPA unless swapped)
        patches.append((decode_attention, "available", lambda *args: False))
    if not fused_step:  # rotary and cache writes as their own ops before the decode kernel (session 20)
        init = static_decoder.StaticDecoder.__init__

        def separate_ops(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.fused_step = False

        patches.append((static_decoder.StaticDecoder, "__init__", separate_ops))
    with contextlib.ExitStack() as stack:
        for target, name, value in patches:
            stack.enter_context(mock.patch.object(target, name, value))
        yield


VARIANTS = {
    "decode kernel with rotary and cache writes, projections one GEMM each (session 21)": dict(
        bucket=64, kernel=True, down_splits=1, o_splits=1, qkv_splits=1
    ),
    "... the o and down projections over 2 and 4 slices of K": dict(bucket=64, kernel=True, qkv_splits=1),
    "... and q/k/v over 2, summed in the decode kernel (default)": dict(bucket=64, kernel=True),
}
if os.environ.get("ROLLOUT_VARIANTS_SLOW"):  # each measured once (sessions 19 to 21), not again by default
    VARIANTS["buckets of 64, GQA decode kernel, Triton sampler (session 20)"] = dict(
        bucket=64, kernel=True, fused_step=False, down_splits=1, o_splits=1, qkv_splits=1
    )
    VARIANTS["whole cache, SDPA, torch sampler (session 19)"] = dict(
        bucket=WHOLE_CACHE, kernel=False, gqa_kernel=False
    )
    VARIANTS["whole cache, SDPA, Triton sampler"] = dict(bucket=WHOLE_CACHE, kernel=True, gqa_kernel=False)
    VARIANTS["buckets of 64, SDPA, Triton sampler"] = dict(bucket=64, kernel=True, gqa_kernel=False)
    VARIANTS["whole cache, GQA decode kernel, Triton sampler"] = dict(bucket=WHOLE_CACHE, kernel=True)
    VARIANTS["buckets of 128, GQA decode kernel, Triton sampler"] = dict(bucket=128, kernel=True)
    VARIANTS["buckets of 64, FlexAttention decode"] = dict(
        bucket=64, kernel=True, gqa_kernel=False, attend=flex_decode
    )
    VARIANTS["buckets of 64, SDPA, GEMM autotune"] = dict(
        bucket=64, kernel=True, gqa_kernel=False, autotune=True
    )
    # session 19's attention formulations (then with the whole cache and the torch sampler): SDPA
    # forced to memory-efficient attention, and GQA as two batched matmuls per KV head
    slow = dict(bucket=64, kernel=True, gqa_kernel=False)
    VARIANTS["buckets of 64, SDPA memory-efficient"] = dict(slow, attend=efficient)
    VARIANTS["buckets of 64, grouped bmm, BF16 scores"] = dict(slow, attend=grouped)
    VARIANTS["buckets of 64, grouped bmm, FP32 scores"] = dict(
        slow, attend=lambda *a: grouped(*a, fp32_scores=True)
    )


def main() -> None:
    args, tokenizer, prompts, params = rollout_setup(__doc__.splitlines()[0])
    rows, reference = [], None
    for name, options in VARIANTS.items():
        torch._dynamo.reset()
        with variant(**options):
            engine = new_engine(args.model, tokenizer)
            try:
                gens, wall = timed_generate(engine, prompts, params)
            except Exception as exc:  # a variant that cannot run here is reported, not fatal
                rows.append((name, None, f"failed: {type(exc).__name__}: {str(exc)[:80]}", ""))
                continue
        lps = torch.tensor([g.completion_logprobs[:32] for g in gens])
        reference = lps if reference is None else reference
        status = (
            f"graphs {'on' if engine.decode == 'cuda_graph' else 'OFF'}, compiled {engine.compile_decode}"
        )
        rows.append((name, wall, status, f"{float((lps - reference).abs().mean()):.4f}"))
        del engine
        torch.cuda.empty_cache()
    base = rows[0][1]
    print(f"{len(prompts)} prompts x {params.max_new_tokens} new tokens on {torch.cuda.get_device_name()}")
    print("| variant | rollout s | vs first | engine | mean abs logprob diff (32 tokens) |")
    print("|---|---|---|---|---|")
    for name, wall, status, drift in rows:
        speed = f"{base / wall:.2f}x" if wall and base else "-"
        print(
            f"| {name} | {wall:.3f} | {speed} | {status} | {drift} |"
            if wall
            else f"| {name} | - | - | {status} | - |"
        )


if __name__ == "__main__":
    main()
