"""``slime-gb10 bench grpo``: our GRPO step on fixed-work shapes, against the device's own limits.

In one run: the device's copy bandwidth and BF16 GEMM rate (measured), then for each shape a
random-init model (every completion runs to the token cap, so the work per step is fixed) trained
for a few steps by our trainer with both phases instrumented. Per step it reports

- rollout time and its fraction of the **decode roofline**: the bytes a decoder must read (all
  weights once per decode step + the KV cache of every sequence still running, from the real prompt
  and completion lengths) over the measured bandwidth, plus the prefill at the GEMM rate;
- train time and **MFU**: ``6·N`` FLOPs per trained token (``N`` = matmul parameters: the
  embedding lookup is free, the LM head is not) plus causal attention ``6·L·d·T`` (PaLM, Chowdhery
  et al. 2022, App. B), plus ``2·N`` per token for every extra forward (old-policy recompute,
  reference model), over the measured GEMM rate;
- weight-sync time and peak memory;
- the same two fractions against the datasheet peaks of the device found (``platform.devices``:
  on a DGX Spark, GB10's 273 GB/s and ~62 TFLOP/s), so runs on different machines compare.

Zero-variance groups are trained (``algo.skip_zero_variance_groups=false``): a random model earns
no reward, and the comparison with TRL (``benchmarks/grpo/``) needs TRL's work per step.
"""

from __future__ import annotations

import gc
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import click

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    name: str
    about: str
    model_type: str  # a transformers architecture with a static-cache decode path: llama, qwen2
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    prompts: int  # prompts per step
    group: int  # samples per prompt
    max_new_tokens: int
    micro_batch: int = 64  # sequences per forward/backward: what fits 80 GB without recomputation
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def model_sizes(self) -> dict:
        """The keyword arguments of :func:`slime_gb10.grpo.models.random_model_config` for this shape."""
        return {
            "model_type": self.model_type, "hidden_size": self.hidden, "num_layers": self.layers,
            "num_heads": self.heads, "num_kv_heads": self.kv_heads, "intermediate_size": self.mlp,
            "tied": self.tied, "max_position_embeddings": 4096,
        }  # fmt: skip


SHAPES = {
    s.name: s
    for s in (
        Shape("A", "SmolLM2-135M", "llama", 576, 30, 9, 3, 1536, 49152, 8, 8, 128),
        # B trains 160 sequences in 4 microbatches of 40: on an H100 (benchmarks/grpo/profile_train.py)
        # 0.608 s per step and 30.9 GiB at peak, against 0.615 s and 43.9 GiB with 64 (64, 64, 32)
        Shape("B", "Qwen2.5-0.5B body, SmolLM2 vocab", "qwen2", 896, 24, 14, 2, 4864, 49152, 20, 8, 512, 40),
        Shape("C", "Qwen2.5-1.5B body, SmolLM2 vocab", "qwen2", 1536, 28, 12, 2, 8960, 49152, 16, 8, 256, 16),
        # the GB10 recipe gsm8k-qwen2.5-0.5b-gb10 (slime PR #1835's run): Qwen2.5-0.5B, 20 x 8, 1,024 tokens
        Shape(
            "gsm8k-0.5b", "Qwen2.5-0.5B (GB10 recipe)", "qwen2", 896, 24, 14, 2, 4864, 151936, 20, 8, 1024, 16
        ),
    )
}


@dataclass(frozen=True)
class ModelCosts:
    params: int  # all parameters (tied embeddings once)
    matmul_params: int  # parameters a token's forward multiplies with: all but the embedding lookup
    weight_bytes: int  # what one decode step reads in BF16: every matrix, the embedding only as the LM head
    kv_bytes_per_token: int  # K and V of one token over all layers, BF16
    layers: int
    attn_dim: int  # heads x head_dim
    # what one decode step would read with the decoder's linear weights as NVFP4 codes (9/16 byte a
    # weight: 4-bit codes and an E4M3 scale per 16) and the rest in BF16 (rollout.weights=nvfp4)
    nvfp4_weight_bytes: int = 0


def model_costs(shape: Shape) -> ModelCosts:
    """Parameter count and bytes of ``shape`` as transformers builds it (RMSNorm weights, Qwen2's
    q/k/v biases), derived by hand; a test compares it with the real model's parameter count."""
    h, d = shape.hidden, shape.head_dim
    q, kv = shape.heads * d, shape.kv_heads * d
    bias = q + 2 * kv if shape.model_type == "qwen2" else 0
    per_layer = h * q + 2 * h * kv + q * h + bias + 3 * h * shape.mlp + 2 * h
    embedding = shape.vocab * h
    head = 0 if shape.tied else shape.vocab * h
    params = shape.layers * per_layer + h + embedding + head
    matmul = params - embedding + (embedding if shape.tied else 0)  # the LM head multiplies V x h
    weight_bytes = 2 * (params - (0 if shape.tied else embedding))
    linear = shape.layers * (h * q + 2 * h * kv + q * h + 3 * h * shape.mlp)  # NVFP4 under rollout.weights
    return ModelCosts(
        params=params,
        matmul_params=matmul,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=2 * shape.layers * kv * 2,
        layers=shape.layers,
        attn_dim=q,
        nvfp4_weight_bytes=weight_bytes - 2 * linear + linear * 9 // 16,
    )


# ---------------------------------------------------------------------------------- the limits
def decode_roofline_bytes(prompt_lens: list[int], completion_lens: list[int], costs: ModelCosts) -> int:
    """Bytes a batched decoder must read to produce these completions after the prefill.

    The prefill yields each sequence's first token; decode step ``t`` (1 ≤ t < longest completion)
    reads the weights once and the KV cache of every sequence still running (``completion > t``),
    which holds ``prompt + t`` tokens.
    """
    longest = max(completion_lens, default=0)
    total = 0
    for t in range(1, longest):
        context = sum(p + t for p, c in zip(prompt_lens, completion_lens, strict=True) if c > t)
        total += costs.weight_bytes + context * costs.kv_bytes_per_token
    return total


def rollout_roofline_s(
    prompt_lens: list[int], completion_lens: list[int], costs: ModelCosts, gbps: float, tflops: float
) -> float:
    """Decode bytes at ``gbps`` plus the prefill: ``2·N`` FLOPs per prompt token at ``tflops``, but
    no less than one read of the weights."""
    prefill = max(
        2 * costs.matmul_params * sum(prompt_lens) / (tflops * 1e12), costs.weight_bytes / (gbps * 1e9)
    )
    return prefill + decode_roofline_bytes(prompt_lens, completion_lens, costs) / (gbps * 1e9)


def train_flops(seq_lens: list[int], costs: ModelCosts, extra_forwards: int = 0) -> float:
    """Forward + backward FLOPs of a step over sequences of ``seq_lens`` tokens: ``(6 + 2·extra)·N``
    per token plus causal attention, ``(3 + extra)·2·L·d·T`` per token of a sequence of length T
    (QK^T and AV: ``4·L·d·T`` per token non-causal forward, halved by the causal mask)."""
    tokens = sum(seq_lens)
    attention = sum(2 * costs.layers * costs.attn_dim * n * n for n in seq_lens)
    return (6 + 2 * extra_forwards) * costs.matmul_params * tokens + (3 + extra_forwards) * attention


def measure_ceilings() -> dict:
    """The device's copy bandwidth (GB/s, read + write) and BF16 GEMM rate (TFLOP/s), measured now."""
    from slime_gb10.bench.ceilings import measure_bf16_gemm, measure_copy_bandwidth
    from slime_gb10.platform.devices import device_peaks

    peaks = device_peaks()
    return {
        "device": peaks.name,
        "copy_gbps": measure_copy_bandwidth(),
        "bf16_tflops": measure_bf16_gemm(),
        "datasheet_gbps": peaks.mem_bandwidth_gbs,
        "datasheet_bf16_tflops": peaks.bf16_tflops,
    }


# ---------------------------------------------------------------------------------- one shape
def write_shape_model(shape: Shape, directory: Path, tokenizer_dir: str, seed: int = 0) -> Path:
    """A random-init model of ``shape`` in BF16 with the tokenizer of ``tokenizer_dir``."""
    import torch

    from slime_gb10.grpo.models import load_tokenizer, write_random_model

    tokenizer = load_tokenizer(tokenizer_dir)
    if len(tokenizer) > shape.vocab:
        raise click.UsageError(f"shape {shape.name}: vocab {shape.vocab} < tokenizer's {len(tokenizer)}")
    return write_random_model(
        directory, tokenizer, vocab_size=shape.vocab, dtype=torch.bfloat16, seed=seed, **shape.model_sizes()
    )


class _LengthRecorder:
    """Wraps an engine's ``generate`` to keep the prompt and completion lengths of every call."""

    def __init__(self, engine):
        self.calls: list[tuple[list[int], list[int]]] = []
        self._generate = engine.generate
        engine.generate = self

    def __call__(self, prompts, params):
        generations = self._generate(prompts, params)
        self.calls.append(([len(p) for p in prompts], [len(g.completion_ids) for g in generations]))
        return generations


def run_shape(
    shape: Shape,
    ceilings: dict,
    *,
    work_dir: Path,
    tokenizer_dir: str,
    steps: int,
    micro_batch_size: int | None = None,
    data: str | None = None,
    settings: dict | None = None,
) -> dict:
    """Train ``steps`` steps on ``shape``; the per-step rows with roofline fractions and MFU.
    ``settings``: further config overrides (``section.key`` -> value), e.g. engine options."""
    from slime_gb10.grpo.config import build_config
    from slime_gb10.grpo.trainer import GRPOTrainer

    model_dir = work_dir / f"model-{shape.name}"
    if not (model_dir / "config.json").is_file():
        write_shape_model(shape, model_dir, tokenizer_dir)
    costs = model_costs(shape)
    overrides = {
        "model.name_or_path": str(model_dir),
        "output.dir": str(work_dir / f"run-{shape.name}-{time.strftime('%Y%m%d-%H%M%S')}"),
        "train.steps": steps,
        "train.lr": 1e-6,
        "train.micro_batch_size": micro_batch_size or shape.micro_batch,
        "rollout.prompts_per_step": shape.prompts,
        "rollout.group_size": shape.group,
        "rollout.max_new_tokens": shape.max_new_tokens,
        "rollout.max_prompt_tokens": 512,
        "algo.skip_zero_variance_groups": False,
        "algo.mask_truncated": False,  # every completion of a random model is cut at the cap: train them
        "eval.every": 0,
        "eval.at_end": False,
        "output.checkpoint_every": 0,
        "output.save_final_model": False,
        "output.progress": False,
        "output.samples_per_step": 0,
        "backends.rollout": "torch",
        "backends.trainer": "torch",
    }
    if data:
        overrides["data.path"] = data
    config = build_config(overrides={**overrides, **(settings or {})})
    trainer = GRPOTrainer(config)
    try:
        trainer.setup()
        recorder = _LengthRecorder(trainer.engine)
        rows = trainer.train()
    finally:
        trainer.close()
    extra = int(not (config.train.epochs == 1 and config.train.minibatches == 1)) + int(
        config.algo.ref_kl_metric
    )
    gbps, tflops = ceilings["copy_gbps"], ceilings["bf16_tflops"]
    sheet_gbps, sheet_tflops = ceilings.get("datasheet_gbps"), ceilings.get("datasheet_bf16_tflops")
    out = []
    for row, (prompt_lens, completion_lens) in zip(rows, recorder.calls, strict=True):
        roof = rollout_roofline_s(prompt_lens, completion_lens, costs, gbps, tflops)
        seqs = [p + c for p, c in zip(prompt_lens, completion_lens, strict=True)]
        flops = train_flops(seqs, costs, extra)
        train_s = row["train_time_s"]
        step = {
            "step": row["step"],
            "step_s": row["step_time_s"],
            "rollout_s": row["rollout_time_s"],
            "rollout_tokens": sum(completion_lens),
            "rollout_roofline_s": roof,
            "rollout_roofline_frac": roof / row["rollout_time_s"],
            "train_s": train_s,
            "train_tokens": sum(seqs),
            "train_tflops": flops / train_s / 1e12 if train_s > 0 else None,
            "mfu": flops / train_s / (tflops * 1e12) if train_s > 0 else None,
            "sync_s": row["sync_time_s"],
            "peak_gib": row.get("peak_memory_gib"),
            "cuda_graph": row.get("rollout/cuda_graph"),
            "compiled_layers": row.get("train/compiled"),
        }
        if config.rollout.weights == "nvfp4":  # the bound if every decode step read only the codes
            from_codes = replace(costs, weight_bytes=costs.nvfp4_weight_bytes)
            step["rollout_roofline_nvfp4_s"] = rollout_roofline_s(
                prompt_lens, completion_lens, from_codes, gbps, tflops
            )
            step["nvfp4_codes_changed"] = row.get("train/nvfp4_codes_changed")
        if sheet_gbps and sheet_tflops:
            sheet_roof = rollout_roofline_s(prompt_lens, completion_lens, costs, sheet_gbps, sheet_tflops)
            step["rollout_roofline_frac_datasheet"] = sheet_roof / row["rollout_time_s"]
            step["mfu_datasheet"] = flops / train_s / (sheet_tflops * 1e12) if train_s > 0 else None
        out.append(step)
    return {"shape": asdict(shape), "costs": asdict(costs), "steps": out}


def summarize(result: dict) -> dict:
    """Medians over the steps after the first (graph capture, allocator and autotuning warm-up)."""
    steps = result["steps"][1:] or result["steps"]

    def median(key):
        values = [s[key] for s in steps if s.get(key) is not None]
        return statistics.median(values) if values else None

    keys = ("step_s", "rollout_s", "rollout_roofline_frac", "rollout_roofline_frac_datasheet", "train_s",
            "mfu", "mfu_datasheet", "train_tflops", "sync_s", "peak_gib", "rollout_roofline_s",
            "rollout_roofline_nvfp4_s", "nvfp4_codes_changed")  # fmt: skip
    summary = {key: median(key) for key in keys}
    summary["rollout_tokens_per_s"] = median("rollout_tokens") / summary["rollout_s"]
    summary["train_tokens_per_s"] = median("train_tokens") / summary["train_s"]
    summary["cuda_graph"] = min((s.get("cuda_graph") or 0.0) for s in result["steps"])
    summary["compiled_layers"] = min((s.get("compiled_layers") or 0.0) for s in result["steps"])
    return summary


def format_table(result: dict) -> str:
    ceil = result["ceilings"]
    settings = " ".join(f"--set {k}={v}" for k, v in result.get("settings", {}).items())
    lines = [
        *([f"settings: {settings}"] if settings else []),
        f"device {ceil['device']}: copy {ceil['copy_gbps']:.0f} GB/s, BF16 GEMM {ceil['bf16_tflops']:.0f} TFLOP/s "
        f"measured (datasheet {ceil.get('datasheet_gbps') or '-'} GB/s, {ceil.get('datasheet_bf16_tflops') or '-'} "
        "TFLOP/s); medians of the steps after the first",
        "",
        "| shape | params | batch | new tokens | s/step | rollout s | rollout tok/s | roofline (meas / sheet) "
        "| train s | train tok/s | MFU (meas / sheet) | sync s | peak GiB | graphs | compiled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    for shape_result in result["shapes"]:
        shape = shape_result["shape"]
        if "error" in shape_result:
            lines.append(f"| {shape['name']} ({shape['about']}) | failed: {shape_result['error'][:80]} |")
            continue
        s = shape_result["summary"]
        lines.append(
            f"| {shape['name']} ({shape['about']}) | {shape_result['costs']['params'] / 1e6:.0f}M "
            f"| {shape['prompts']}×{shape['group']} | {shape['max_new_tokens']} | {s['step_s']:.3f} "
            f"| {s['rollout_s']:.3f} | {s['rollout_tokens_per_s']:.0f} "
            f"| {pct(s['rollout_roofline_frac'])} / {pct(s['rollout_roofline_frac_datasheet'])} "
            f"| {s['train_s']:.3f} | {s['train_tokens_per_s']:.0f} | {pct(s['mfu'])} / {pct(s['mfu_datasheet'])} "
            f"| {s['sync_s']:.3f} | {s['peak_gib'] or 0:.1f} | {'on' if s['cuda_graph'] else 'OFF'} "
            f"| {'on' if s['compiled_layers'] else 'off'} |"
        )
    for shape_result in result["shapes"]:
        s, costs = shape_result.get("summary") or {}, shape_result["costs"]
        if s.get("rollout_roofline_nvfp4_s") is None:
            continue
        lines.append(
            f"- {shape_result['shape']['name']}, NVFP4 rollouts: the engine decodes the dequantized weights with "
            f"BF16 kernels ({costs['weight_bytes'] / 1e6:.0f} MB of weights per decode step; roofline "
            f"{s['rollout_roofline_s']:.3f} s). Decoding from the codes would read "
            f"{costs['nvfp4_weight_bytes'] / 1e6:.0f} MB ({costs['weight_bytes'] / costs['nvfp4_weight_bytes']:.2f}x "
            f"fewer): a roofline of {s['rollout_roofline_nvfp4_s']:.3f} s, a projection from bytes, not a "
            f"measurement. Codes changed per sync: {s['nvfp4_codes_changed'] or 0:.2e}."
        )
    return "\n".join(lines)


def run_benchmark(
    shapes: list[str],
    *,
    steps: int,
    micro_batch_size: int | None,
    tokenizer_dir: str,
    work_dir: Path,
    data: str | None,
    settings: dict | None = None,
) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise click.ClickException("bench grpo needs a CUDA GPU (it measures the device's limits)")
    ceilings = measure_ceilings()
    result = {
        "settings": settings or {},
        "ceilings": ceilings,
        "shapes": [],
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    for name in shapes:
        log.info("shape %s: %s", name, SHAPES[name].about)
        try:
            shape_result = run_shape(
                SHAPES[name], ceilings, work_dir=work_dir, tokenizer_dir=tokenizer_dir, steps=steps,
                micro_batch_size=micro_batch_size, data=data, settings=settings,
            )  # fmt: skip
            shape_result["summary"] = summarize(shape_result)
        except torch.OutOfMemoryError as exc:  # report it and go on with the other shapes
            first = str(exc).splitlines()[0]
            log.error("shape %s: out of memory (%s)", name, first)
            shape_result = {
                "shape": asdict(SHAPES[name]),
                "costs": asdict(model_costs(SHAPES[name])),
                "error": first,
            }
        result["shapes"].append(shape_result)
        gc.collect()
        torch.cuda.empty_cache()
    return result


@click.command("grpo")
@click.option(
    "--shapes", default="A,B,C", show_default=True, help=f"Comma-separated, of {', '.join(SHAPES)}."
)
@click.option(
    "--steps",
    default=4,
    show_default=True,
    type=click.IntRange(2),
    help="Steps per shape (the first compiles and is left out of the medians: 4 gives a median of three).",
)
@click.option("--micro-batch-size", default=None, type=click.IntRange(1), help="Default: each shape's own.")
@click.option("--tokenizer", "tokenizer_dir", default=None, help="Tokenizer directory (default: SmolLM2's).")
@click.option("--data", default=None, help="Prompts (a data.path value); default: the arithmetic task.")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Models and runs (default: a temp dir).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A config override, e.g. rollout.compile_decode=true.",
)
@click.option(
    "--rollout-weights",
    type=click.Choice(["bf16", "nvfp4"]),
    default="bf16",
    show_default=True,
    help="nvfp4: NVFP4 rollouts (and QAT, the config's default with them); the table adds the decode "
    "roofline as if every decode step read only the 4-bit codes (the engine keeps BF16 where it is faster).",
)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write the result here."
)
def bench_grpo_command(
    shapes, steps, micro_batch_size, tokenizer_dir, data, work_dir, settings, rollout_weights, json_path
) -> None:
    """Our GRPO step on fixed-work shapes: rollout vs the decode roofline, train MFU, sync, memory."""
    from slime_gb10.grpo.models import default_tokenizer_dir
    from slime_gb10.utils.atomic import atomic_write_text

    names = [s.strip() for s in shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise click.UsageError(f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    bad = [item for item in settings if "=" not in item]
    if bad:
        raise click.UsageError(f"--set {bad[0]!r}: expected section.key=value")
    overrides = dict(item.split("=", 1) for item in settings)
    if rollout_weights != "bf16":
        overrides["rollout.weights"] = rollout_weights
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="slime-gb10-bench-grpo-"))
    result = run_benchmark(
        names, steps=steps, micro_batch_size=micro_batch_size, work_dir=work, data=data, settings=overrides,
        tokenizer_dir=tokenizer_dir or str(default_tokenizer_dir()),
    )  # fmt: skip
    if json_path:
        atomic_write_text(Path(json_path), json.dumps(result, indent=1) + "\n")
    click.echo(format_table(result))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    bench_grpo_command()
