"""Supervised fine-tuning on reference solutions (``slime-gb10 sft``): a warm start before GRPO.

Issue #42 allows it on GSM8K, reported as its own row, with GRPO's gain measured from its
checkpoint. The same data and model plumbing as ``train``: the examples of ``data`` (a source with
reference solutions: the GSM8K layout keeps each worked answer), the chat-templated prompt ids that
``train`` and ``eval`` use (:class:`~slime_gb10.grpo.prompts.PromptEncoder`), the model of ``model``.

The objective, in full: the token-mean negative log-likelihood of the solution tokens and EOS given
the prompt, over every solution token of an optimizer step's ``sft.batch_size`` examples (prompt and
padding tokens carry no loss). GSM8K's calculator annotations (``<<48/2=24>>``) are dropped from the
target, and its final line is kept as ``#### 72``: the format the ``gsm8k`` reward reads. FP32
master weights, BF16 autocast on a GPU, AdamW with a linear warm-up then a constant rate, the
gradient norm clipped at ``train.max_grad_norm``.

A plain loop, not TRL's ``SFTTrainer`` or ``transformers.Trainer``: those bring their own data
pipeline and run-directory rules, and the point here is that SFT sees exactly the prompts GRPO and
eval see and writes a run directory with the same guarantees (``rundir.open_run_dir``: never
silently reused; atomic ``final_model/``).

Writes ``<output>/config.yaml``, ``metrics.jsonl`` (per step: loss, solution tokens, learning
rate, gradient norm, step time; the held-out loss before and after) and ``final_model/`` (HF
layout with the tokenizer, FP32: ``slime-gb10 train --model <output>/final_model``). No
checkpoints: an interrupted SFT run starts over (``--overwrite``); it takes minutes on a GPU.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from slime_gb10.utils.errors import UserError

log = logging.getLogger("slime_gb10.grpo")

IGNORE = -100
_CALCULATOR = re.compile(r"<<[^<>]*>>")


class SFTDiverged(UserError, FloatingPointError):
    """A step's loss or gradient is not finite; the message names the step and the setting."""


class SFTDataError(UserError, ValueError):
    """The data cannot be used for SFT; the message says why and what to pass instead."""


def solution_text(solution: str) -> str:
    """A reference solution as the target: GSM8K's ``<<a*b=c>>`` annotations removed, the final
    ``#### answer`` on its own line without thousands separators."""
    text = _CALCULATOR.sub("", solution).strip()
    body, marker, final = text.rpartition("####")
    if not marker:
        return text
    return f"{body.rstrip()}\n#### {final.strip().replace(',', '')}".lstrip("\n")


@dataclass(frozen=True)
class Encoded:
    ids: list[int]  # prompt + solution + EOS
    start: int  # index of the first solution token: the loss covers ids[start:]


def encode(examples: list, prompts: Any, tokenizer: Any, eos_id: int, max_tokens: int) -> list[Encoded]:
    """Token ids of each example (prompt from ``prompts``, solution + EOS); examples over
    ``max_tokens`` are left out, and how many is logged."""
    from slime_gb10.grpo.prompts import PromptTooLongError

    kept, too_long = [], 0
    for example in examples:
        try:
            prompt = prompts.ids(example)
        except PromptTooLongError:
            too_long += 1
            continue
        target = tokenizer(solution_text(example.solution), add_special_tokens=False)["input_ids"]
        ids = [*prompt, *target, eos_id]
        if len(ids) > max_tokens:
            too_long += 1
            continue
        kept.append(Encoded(ids=ids, start=len(prompt)))
    if too_long:
        log.warning(
            "%d of %d examples are longer than sft.max_tokens=%d (or their prompt than "
            "rollout.max_prompt_tokens) and were left out",
            too_long,
            len(examples),
            max_tokens,
        )
    return kept


def collate(batch: list[Encoded], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, labels)``; labels are :data:`IGNORE` on the prompt and
    the padding, the token itself on the solution (the shift happens in :func:`solution_nll`)."""
    width = max(len(e.ids) for e in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e.ids)
        input_ids[row, :n] = torch.tensor(e.ids)
        mask[row, :n] = 1
        labels[row, e.start : n] = input_ids[row, e.start : n]
    return input_ids, mask, labels


def solution_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(summed negative log-likelihood, number of tokens)`` of the labelled tokens: position ``t``'s
    logits predict token ``t + 1``."""
    targets = labels[:, 1:]
    nll = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction="sum",
    )
    return nll, int((targets != IGNORE).sum())


def step_batches(n: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Example indices of each optimizer step: ``epochs`` seeded shuffles, cut into ``batch_size``
    (an epoch's last, shorter batch is kept)."""
    steps = []
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(f"{seed}:sft:{epoch}").shuffle(order)
        steps += [order[i : i + batch_size] for i in range(0, n, batch_size)]
    return steps


def _forward_nll(
    model, batch: list[Encoded], pad_id: int, device, autocast: bool
) -> tuple[torch.Tensor, int]:
    input_ids, mask, labels = (t.to(device) for t in collate(batch, pad_id))
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=input_ids, attention_mask=mask).logits
    return solution_nll(logits, labels)


def accumulate_step(model, batch: list[Encoded], micro: int, pad_id: int, device, autocast: bool) -> float:
    """Backward of one optimizer step's loss: the mean NLL over ALL its solution tokens, whatever
    the micro-batching (each micro-batch's summed NLL is divided by the step's token count).
    Returns that loss; the gradients are left in ``model``'s parameters."""
    tokens = sum(len(e.ids) - e.start for e in batch)
    total = 0.0
    for i in range(0, len(batch), micro):
        nll, _ = _forward_nll(model, batch[i : i + micro], pad_id, device, autocast)
        (nll / tokens).backward()
        total += float(nll.detach())
    return total / tokens


@torch.no_grad()
def mean_nll(model, examples: list[Encoded], micro: int, pad_id: int, device, autocast: bool) -> float:
    """Token-mean NLL of the solutions of ``examples`` (NaN for none)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(examples), micro):
        nll, n = _forward_nll(model, examples[i : i + micro], pad_id, device, autocast)
        total, count = total + float(nll), count + n
    model.train()
    return total / count if count else math.nan


def run_sft(config, *, overwrite: bool = False, progress: bool = True) -> dict:
    """Fine-tune ``config.model`` on the reference solutions of ``config.data``; see the module doc."""
    from slime_gb10.grpo import prompts as prompt_data
    from slime_gb10.grpo.metrics import require_reporter
    from slime_gb10.grpo.rundir import open_run_dir

    source, held_out = prompt_data.load_splits(config.data, config.train.seed)
    if not isinstance(source, list) or not source or any(e.solution is None for e in source):
        raise SFTDataError(
            f"slime-gb10 sft trains on reference solutions, and data.path={config.data.path!r} has none: "
            "use a GSM8K-layout source (question, answer with a worked solution ending '#### n'), e.g. --data gsm8k"
        )
    held_out = [e for e in held_out if e.solution is not None]
    require_reporter(config.output.report_to)  # before the directory is opened and the model loaded
    run = open_run_dir(config.output.dir, overwrite=overwrite)  # refused before anything loads
    run_dir = Path(config.output.dir)
    try:
        return _train(config, run_dir, source, held_out, progress)
    except BaseException:
        run.abandon()  # removes the directory only if this run created it and nothing was written
        raise
    finally:
        run.close()


def _train(config, run_dir: Path, source: list, held_out: list, progress: bool) -> dict:
    from slime_gb10.grpo import prompts as prompt_data
    from slime_gb10.grpo.metrics import RunLogger
    from slime_gb10.grpo.models import eos_token_ids, load_causal_lm, load_tokenizer, resolve_model_path
    from slime_gb10.grpo.registry import resolve_device
    from slime_gb10.utils.atomic import atomic_directory

    sft, train = config.sft, config.train
    torch.manual_seed(train.seed)
    device = resolve_device(config.backends.device)
    path = resolve_model_path(config.model.name_or_path)
    tokenizer = load_tokenizer(path, config.model.trust_remote_code)
    model = load_causal_lm(
        path,
        dtype=torch.float32,
        attn_implementation=config.model.attn_implementation,
        trust_remote_code=config.model.trust_remote_code,
    ).to(device)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    prompts = prompt_data.PromptEncoder.from_config(tokenizer, config)
    # the chat turn's end (<|im_end|>): the tokenizer's own EOS; the model's lowest EOS id otherwise
    # (Qwen2.5-Instruct lists <|endoftext|> first in its generation config, which ends no turn)
    eos_id = (
        tokenizer.eos_token_id if tokenizer.eos_token_id is not None else eos_token_ids(tokenizer, model)[0]
    )
    pad_id = tokenizer.pad_token_id
    examples = encode(source, prompts, tokenizer, eos_id, sft.max_tokens)
    held = encode(held_out, prompts, tokenizer, eos_id, sft.max_tokens)
    if not examples:
        raise SFTDataError(f"every training example is longer than sft.max_tokens={sft.max_tokens}: raise it")
    autocast = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=sft.lr, weight_decay=train.weight_decay, eps=train.adam_eps, fused=autocast
    )
    steps = step_batches(len(examples), sft.batch_size, sft.epochs, train.seed)
    logger = None
    try:
        logger = RunLogger.open(run_dir, config)
        before = mean_nll(model, held, sft.micro_batch_size, pad_id, device, autocast)
        logger.log_step({"step": 0, "eval/loss": before, "eval/examples": len(held)})
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(steps), desc="SFT", unit="step", dynamic_ncols=True)
        for step, indices in enumerate(steps, start=1):
            start = time.perf_counter()
            lr = sft.lr * min(1.0, step / sft.warmup_steps) if sft.warmup_steps else sft.lr
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = [examples[i] for i in indices]
            optimizer.zero_grad(set_to_none=True)
            loss = accumulate_step(model, batch, sft.micro_batch_size, pad_id, device, autocast)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm))
            if not math.isfinite(loss) or not math.isfinite(grad_norm):
                raise SFTDiverged(
                    f"SFT step {step}: the loss or gradient is not finite; lower sft.lr (now {sft.lr})"
                )
            optimizer.step()
            if autocast:
                torch.cuda.synchronize(device)
            row = {
                "step": step,
                "loss": loss,
                "tokens": sum(len(e.ids) - e.start for e in batch),
                "lr": lr,
                "grad_norm": grad_norm,
                "step_time_s": time.perf_counter() - start,
            }
            logger.log_step(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.3f}")
        if bar is not None:
            bar.close()
        after = mean_nll(model, held, sft.micro_batch_size, pad_id, device, autocast)
        logger.log_step({"step": len(steps), "eval/loss": after, "eval/examples": len(held)})
        with atomic_directory(run_dir / "final_model") as tmp:
            # FP32, whatever output.final_model_dtype says: this is GRPO's starting point, and sft
            # writes no checkpoint that would keep the master weights otherwise
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
    finally:
        if logger is not None:
            logger.close()
    return {
        "steps": len(steps),
        "examples": len(examples),
        "held_out_loss_before": before,
        "held_out_loss_after": after,
        "final_model": str(run_dir / "final_model"),
    }
