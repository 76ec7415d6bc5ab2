"""Decode attention over the static KV cache, measured: the engine's SDPA (whichever backend torch
picks for a boolean mask) against a forced backend and a grouped-query formulation as two batched
matmuls (GQA rows per KV head, no repeated cache), each inside the compiled, CUDA-graphed decode step
of a ``bench grpo`` shape's random-init model (written by ``slime-gb10 bench grpo --work-dir``).

    python benchmarks/grpo/dev/decode_attention.py WORK_DIR/model-B --prompts 160 --new-tokens 512
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from slime_gb10.grpo.engines import decode_attention as gqa_kernel
from slime_gb10.grpo.engines.torch_engine import StaticDecoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/grpo: the rollout scripts' helpers
from profile_rollout import new_engine, rollout_setup, timed_generate

SDPA = StaticDecoder.attend


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


VARIANTS = {
    "sdpa (default backend)": SDPA,
    "sdpa efficient-attention": efficient,
    "grouped bmm, BF16 scores": grouped,
    "grouped bmm, FP32 scores": lambda *a: grouped(*a, fp32_scores=True),
}


def main() -> None:
    args, tokenizer, prompts, params = rollout_setup(__doc__.splitlines()[0])
    # one-token steps through StaticDecoder.attend, i.e. these variants, not the engine's GQA kernel
    # (rollout_variants.py compares that kernel with SDPA)
    gqa_kernel.available = lambda *args: False
    rows, reference = [], None
    for name, attend in VARIANTS.items():
        torch._dynamo.reset()
        StaticDecoder.attend = staticmethod(attend)
        engine = new_engine(args.model, tokenizer)
        try:
            gens, wall = timed_generate(engine, prompts, params)
        except Exception as exc:  # a variant that cannot run here is reported, not fatal
            rows.append((name, None, f"failed: {type(exc).__name__}: {str(exc)[:80]}", ""))
            continue
        lps = torch.tensor([g.completion_logprobs[:32] for g in gens])
        if reference is None:
            reference = lps
        drift = float((lps - reference).abs().mean())
        status = (
            f"graphs {'on' if engine.decode == 'cuda_graph' else 'OFF'}, compiled {engine.compile_decode}"
        )
        rows.append((name, wall, status, f"{drift:.4f}"))
        del engine
        torch.cuda.empty_cache()
    StaticDecoder.attend = staticmethod(SDPA)
    print(
        f"{torch.cuda.get_device_name()}, {args.prompts} rows x {args.new_tokens} new tokens, torch {torch.__version__}"
    )
    print("| decode attention | rollout s | engine | mean abs logprob drift vs the first, tokens 1-32 |")
    print("|---|---|---|---|")
    for name, wall, status, drift in rows:
        print(f"| {name} | {'-' if wall is None else f'{wall:.3f}'} | {status} | {drift} |")


if __name__ == "__main__":
    main()
