"""Decode attention over the static KV cache, measured: the engine's SDPA (whichever backend torch
picks for a boolean mask) against a forced backend and a grouped-query formulation as two batched
matmuls (GQA rows per KV head, no repeated cache), each inside the compiled, CUDA-graphed decode step
of a ``bench grpo`` shape's random-init model (written by ``slime-gb10 bench grpo --work-dir``).

    python benchmarks/grpo/dev/decode_attention.py WORK_DIR/model-B --prompts 160 --new-tokens 512
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from slime_gb10.grpo.engines.torch_engine import StaticDecoder, TorchRolloutEngine
from slime_gb10.grpo.interfaces import SamplingParams
from slime_gb10.grpo.models import eos_token_ids, load_causal_lm, load_tokenizer

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
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=160)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=512)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (args.prompts, args.prompt_tokens), generator=g).tolist()
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    rows, reference = [], None
    for name, attend in VARIANTS.items():
        torch._dynamo.reset()
        StaticDecoder.attend = staticmethod(attend)
        model = load_causal_lm(args.model, dtype=torch.bfloat16).cuda()
        engine = TorchRolloutEngine(model, tokenizer, "cuda", eos_token_ids=eos_token_ids(tokenizer, model))
        try:
            engine.generate(prompts, params)  # compile, capture, warm-up
            torch.cuda.synchronize()
            start = time.perf_counter()
            gens = engine.generate(prompts, params)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
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
        del engine, model
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
