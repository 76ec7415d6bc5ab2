"""``slime-gb10 bench decode``: the torch engine's decode speed from BF16 weights and from NVFP4 codes.

For each shape, weights and batch: one rollout warms the engine up (compile, CUDA graphs), a second
is timed end to end (prefill, decode, sampling: completion tokens per second), and the CUDA graph of
its last decode step is replayed alone (CUDA events): the step's time against the bytes it must read,
weights (the NVFP4 codes of the layers whose W4A16 kernel beats a BF16 GEMM at this batch, BF16
for the rest, as the engine chooses) plus the KV cache it attends over, at the device's copy
bandwidth measured in the same run. The GB10 column divides the same bytes by its 273 GB/s: a
projection (an upper bound on tokens per second), not a measurement.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import click

from slime_gb10.bench.grpo import SHAPES, Shape, measure_ceilings, model_costs

GB10_GBPS = 273.0  # LPDDR5x, the datasheet's (REFERENCE.md)

DECODE_SHAPES = {
    "B": SHAPES["B"],
    "C": SHAPES["C"],
    # the 7-8B class the issue asks for: Qwen2.5-7B's body (28 layers, 3584 wide, 28 heads / 4 KV
    # heads, MLP 18944, untied head) with SmolLM2's vocabulary like the other shapes (the tokenizer
    # decodes every id); 16 prompts x 8 samples as shape C's batch
    "7b": Shape(
        "7b", "Qwen2.5-7B body, SmolLM2 vocab", "qwen2", 3584, 28, 28, 4, 18944, 49152, 16, 8, 256, tied=False
    ),
}


def build_engine(shape: Shape, weights: str, tokenizer, *, device: str = "cuda", compile_decode: bool = True):
    """The torch engine over a random-init BF16 model of ``shape`` built on the GPU (a 7B shape in
    seconds, no checkpoint written), holding BF16 weights or NVFP4 codes of them."""
    import torch
    import transformers

    from slime_gb10.grpo.engines.torch.engine import TorchRolloutEngine
    from slime_gb10.grpo.models import random_model_config

    config = random_model_config(vocab_size=shape.vocab, **shape.model_sizes())
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    return TorchRolloutEngine(
        model, tokenizer, device, eos_token_ids=[], decode="cuda_graph", compile_decode=compile_decode,
        weights=weights,
    )  # fmt: skip


def step_weight_bytes(engine, batch: int) -> int:
    """Bytes of weights one decode step of ``batch`` rows reads: each layer's NVFP4 codes where the
    engine multiplies by them at this M (``static_decoder.layer_codes``), else its BF16 weight, and the
    embedding row lookups (negligible) left out; the LM head in BF16."""
    import torch

    from slime_gb10.grpo.engines.torch.static_decoder import DECODE_WEIGHT
    from slime_gb10.nvfp4.decode_weights import decode_pays

    total = 0
    counted = set()
    for module in engine.model.modules():
        codes = getattr(module, DECODE_WEIGHT, None)
        if codes is None:
            continue
        pays = decode_pays(codes, batch, torch.bfloat16, codes.data.device)
        total += codes.nbytes if pays else 2 * codes.shape.numel()
        # the weights these codes stand for: fused q/k/v on the attention, gate/up on the MLP
        parts = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        covered = [getattr(module, n).weight for n in parts if hasattr(module, n)] or [module.weight]
        counted.update(id(w) for w in covered)
    for name, param in engine.model.named_parameters():
        if param.dim() == 2 and id(param) not in counted and "embed_tokens" not in name:
            total += param.numel() * param.element_size()
    head = engine.model.get_output_embeddings().weight
    if engine.model.config.tie_word_embeddings:  # the tied head is the embedding: read once per step
        total += head.numel() * head.element_size()
    return total


def replay_ms(engine, batch: int, reps: int = 50) -> tuple[float, int]:
    """Median milliseconds of the last captured decode step of ``batch`` rows, and its attention span."""
    import torch

    key = max(k for k in engine._graphs if k[0] == batch)
    step = engine._graphs[key]
    length = max(step.graphs)
    for _ in range(3):
        step.replay(length)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.replay(length)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), length


def measure(shape: Shape, weights: str, batches: list[int], ceilings: dict, tokenizer, *, prompt_tokens: int, new_tokens: int) -> list[dict]:  # fmt: skip
    import torch

    from slime_gb10.grpo.interfaces import SamplingParams

    engine = build_engine(shape, weights, tokenizer)
    costs = model_costs(shape)
    rows = []
    for batch in batches:
        prompts = [[(13 * row + 7 * j) % 4000 + 100 for j in range(prompt_tokens)] for row in range(batch)]
        params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)
        engine.generate(prompts, params)  # compile, capture
        torch.cuda.synchronize()
        start = time.perf_counter()
        generations = engine.generate(prompts, params)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = sum(len(g.completion_ids) for g in generations)
        ms, span = replay_ms(engine, batch)
        weight_bytes = step_weight_bytes(engine, batch)
        step_bytes = weight_bytes + batch * span * costs.kv_bytes_per_token
        roof_ms = step_bytes / (ceilings["copy_gbps"] * 1e9) * 1e3
        rows.append({
            "shape": shape.name, "weights": weights, "batch": batch, "step_ms": ms,
            "step_tokens_per_s": batch / (ms * 1e-3), "rollout_tokens_per_s": tokens / seconds,
            "rollout_s": seconds, "weight_bytes": weight_bytes, "step_bytes": step_bytes,
            "attention_span": span, "roofline_ms": roof_ms, "roofline_frac": roof_ms / ms,
            "gb10_bound_tokens_per_s": batch / (step_bytes / (GB10_GBPS * 1e9)),
            "cuda_graph": engine.decode == "cuda_graph",
        })  # fmt: skip
    engine.shutdown()
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def format_table(result: dict) -> str:
    c = result["ceilings"]
    lines = [
        f"device {c['device']}: copy {c['copy_gbps']:.0f} GB/s (read + write), BF16 GEMM {c['bf16_tflops']:.0f} TFLOP/s",
        "| shape | batch | weights | step ms | tok/s (step) | × BF16 | MB/step | roofline ms | % roofline "
        "| rollout tok/s | × BF16 | GB10 bound tok/s (projection) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    bf16 = {(r["shape"], r["batch"]): r for r in result["rows"] if r["weights"] == "bf16"}
    for r in result["rows"]:
        base = bf16.get((r["shape"], r["batch"]))
        step_x = f"{base['step_ms'] / r['step_ms']:.2f}" if base else "—"
        roll_x = f"{r['rollout_tokens_per_s'] / base['rollout_tokens_per_s']:.2f}" if base else "—"
        lines.append(
            f"| {r['shape']} | {r['batch']} | {r['weights']} | {r['step_ms']:.3f} | {r['step_tokens_per_s']:,.0f} "
            f"| {step_x} | {r['step_bytes'] / 1e6:,.0f} | {r['roofline_ms']:.3f} | {100 * r['roofline_frac']:.0f}% "
            f"| {r['rollout_tokens_per_s']:,.0f} | {roll_x} | {r['gb10_bound_tokens_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def parse_batches(text: str, shape: Shape) -> list[int]:
    """``1,8,32,64,grpo`` -> batch sizes; ``grpo`` is the shape's prompts x group."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if item == "grpo":
            out.append(shape.prompts * shape.group)
        elif item.isdigit() and int(item) > 0:
            out.append(int(item))
        elif item:
            raise click.UsageError(f"--batches: {item!r} is neither a positive number nor 'grpo'")
    return sorted(set(out))


@click.command("decode")
@click.option(
    "--shapes", default="B,C,7b", show_default=True, help=f"Comma-separated, of {', '.join(DECODE_SHAPES)}."
)
@click.option(
    "--batches", default="1,8,32,64,grpo", show_default=True,
    help="Rows decoded at once; grpo: the shape's prompts x group.",
)  # fmt: skip
@click.option(
    "--weights", default="bf16,nvfp4", show_default=True, help="Comma-separated, of bf16 and nvfp4."
)
@click.option("--prompt-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--new-tokens", default=128, show_default=True, type=click.IntRange(2))
@click.option("--tokenizer", "tokenizer_dir", default=None, help="Tokenizer directory (default: SmolLM2's).")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write the result here."
)
def bench_decode_command(
    shapes, batches, weights, prompt_tokens, new_tokens, tokenizer_dir, json_path
) -> None:
    """The torch engine's decode from BF16 weights vs NVFP4 codes: step time against the bytes it reads."""
    import torch

    from slime_gb10.grpo.models import default_tokenizer_dir, load_tokenizer
    from slime_gb10.utils.atomic import atomic_write_text

    if not torch.cuda.is_available():
        raise click.UsageError("bench decode times CUDA graphs: it needs a CUDA GPU")
    names = [s.strip() for s in shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in DECODE_SHAPES]
    kinds = [w.strip() for w in weights.split(",") if w.strip()]
    if unknown:
        raise click.UsageError(
            f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(DECODE_SHAPES)}"
        )
    if not kinds or any(w not in ("bf16", "nvfp4") for w in kinds):
        raise click.UsageError(f"--weights {weights!r}: choose from bf16, nvfp4")
    tokenizer = load_tokenizer(tokenizer_dir or str(default_tokenizer_dir()))
    result = {
        "ceilings": measure_ceilings(),
        "shapes": {n: asdict(DECODE_SHAPES[n]) for n in names},
        "rows": [],
    }
    for name in names:
        shape = DECODE_SHAPES[name]
        for kind in kinds:
            result["rows"] += measure(
                shape, kind, parse_batches(batches, shape), result["ceilings"], tokenizer,
                prompt_tokens=prompt_tokens, new_tokens=new_tokens,
            )  # fmt: skip
    if json_path:
        atomic_write_text(Path(json_path), json.dumps(result, indent=1) + "\n")
    click.echo(format_table(result))
