"""TRL's ``GRPOTrainer`` on a recipe's task, for time-to-accuracy against our trainer (issue #42).

Only a benchmark: TRL is NOT a dependency of slime-gb10. Everything but the trainer is ours and
read from the same recipe and ``--set`` items our run gets: the training prompts in the same order
(``PromptSampler`` with the run's seed), the same instruction, system prompt and chat template, the
same reward function (``data.reward``), group, batch, lr, clip, lengths and temperature. Master
weights in FP32 with BF16 autocast, as ours (``bf16=True`` on an FP32 model). The recipe's stop
strings / regexes become a ``StoppingCriteria`` running our engine's stop test, and DAPO's overlong
buffer a second reward function (the same ``algo.overlong_penalty``), so a recipe keeps its length
remedies on both sides.

The clock: the sum of TRL's step times (``on_step_begin`` -> ``on_step_end``, CUDA synchronized;
generation, reward and update, as TRL does them in ``training_step``), with the model load before
it and the checkpoint writes excluded, as our ``metrics.jsonl`` counts ``step_time_s``. Every
``--save-every`` steps the weights go to ``OUT/step-NNNNNN/`` (HF layout) with the clock reading in
``OUT/clock.json``; ``slime-gb10 eval --model OUT/step-NNNNNN`` scores them afterwards with exactly
the evaluator our run's in-loop eval uses. Stops at ``--steps`` or once the clock passes ``--budget-s``.

    python benchmarks/rg/trl_tta.py --config rg-smollm2-135m --set data.path=rg:gcd \\
        --model DIR --out OUT --save-every 10 --budget-s 480
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--config", required=True, help="recipe name or file (as `slime-gb10 train --config`)"
    )
    parser.add_argument("--set", action="append", default=[], dest="sets", help="section.key=value, as train")
    parser.add_argument("--model", required=True, help="HF model directory (the converted GGUF)")
    parser.add_argument("--out", required=True, help="directory for the checkpoints and clock.json")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument(
        "--budget-s", type=float, default=float("inf"), help="stop once the clock passes this"
    )
    args = parser.parse_args()

    import dataclasses

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from slime_gb10.grpo import prompts
    from slime_gb10.grpo.algo import overlong_penalty
    from slime_gb10.grpo.config import build_config
    from slime_gb10.grpo.engines.torch.stops import stops_in
    from slime_gb10.grpo.interfaces import SamplingParams
    from slime_gb10.grpo.rewards import get_reward

    cfg = build_config(args.config, sets=args.sets)
    r, t, a = cfg.rollout, cfg.train, cfg.algo
    if a.truncated_reward is not None or a.mask_truncated:
        parser.error(
            "only the stop strings/regexes and DAPO's overlong buffer have a TRL counterpart here: "
            "unset algo.truncated_reward and algo.mask_truncated (and in our run)"
        )
    cuda = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # the prompts, in our trainer's order: its sampler with the run's seed, batch after batch
    source, _ = prompts.load_splits(cfg.data, t.seed)
    sampler = prompts.PromptSampler(source, batch_size=r.prompts_per_step, seed=t.seed, order=cfg.data.order)
    batches = [sampler.next_batch() for _ in range(t.steps + 1)]

    def content(question: str) -> str:
        text = question.strip()
        return f"{text}\n{cfg.data.instruction}" if cfg.data.instruction else text

    def conversation(question: str) -> list[dict]:
        system = [{"role": "system", "content": cfg.data.system_prompt}] if cfg.data.system_prompt else []
        return [*system, {"role": "user", "content": content(question)}]

    dataset = Dataset.from_list(
        [{"prompt": conversation(e.prompt), "ground_truth": e.ground_truth} for b in batches for e in b]
    )
    score = get_reward(cfg.data.reward_spec())

    def task(completions, ground_truth, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [float(score(text, truth)) for text, truth in zip(texts, ground_truth)]

    def overlong(completion_ids, **_):
        """DAPO's soft overlong penalty (algo.overlong_penalty, the same function as ours), as a
        second reward TRL adds to the task's: shape_rewards adds it the same way."""
        lengths = torch.tensor([len(ids) for ids in completion_ids])
        return overlong_penalty(lengths, r.max_new_tokens, a.overlong_buffer).tolist()

    reward_funcs = [task, overlong] if a.overlong_buffer else [task]

    class Clock(TrainerCallback):
        """Step times (CUDA synchronized); every ``--save-every`` steps a checkpoint, off the clock."""

        def __init__(self):
            self.total = 0.0
            self.clock: list[float] = []  # after each step
            self.rows: list[dict] = []  # the checkpoints
            self._start = 0.0

        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, targs, state, control, model=None, **k):
            if cuda:
                torch.cuda.synchronize()
            self.total += time.perf_counter() - self._start
            step = state.global_step
            self.clock.append(self.total)
            done = step >= t.steps or self.total >= args.budget_s
            if step % args.save_every == 0 or done:
                model.save_pretrained(out / f"step-{step:06d}", safe_serialization=True)
                tokenizer.save_pretrained(out / f"step-{step:06d}")
                self.rows.append({"step": step, "clock_s": self.total, "dir": f"step-{step:06d}"})
                (out / "clock.json").write_text(json.dumps({"trl": trl_version, "rows": self.rows}) + "\n")
            if done:
                control.should_training_stop = True
            return control

    trl_version = __import__("trl").__version__
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if r.stop or r.stop_regex:
        # TRL's HF-generate path takes no stop criteria: our engine's stop test (engines/torch/stops.py) on
        # each row's completion text, as a StoppingCriteria passed to every generate call. HF then pads
        # a stopped row with pad_token_id (<|im_end|> here), which TRL's EOS mask keeps as the
        # completion's last token: one unsampled end token per stopped completion, which ours lacks.
        from transformers import StoppingCriteria, StoppingCriteriaList

        stop_params = SamplingParams(stop=tuple(r.stop), stop_regex=tuple(r.stop_regex))

        class CompletionStops(StoppingCriteria):
            def __init__(self, start: int):
                self.start = start

            def __call__(self, input_ids, scores, **kwargs):
                tails = tokenizer.batch_decode(input_ids[:, self.start :][:, -64:], skip_special_tokens=True)
                return torch.tensor([stops_in(text, stop_params) for text in tails], device=input_ids.device)

        generate = model.generate

        def generate_with_stops(*args, **kwargs):
            kwargs["stopping_criteria"] = StoppingCriteriaList(
                [CompletionStops(kwargs["input_ids"].shape[1])]
            )
            return generate(*args, **kwargs)

        model.generate = generate_with_stops
    per_step = r.prompts_per_step * r.group_size
    micro = min(t.micro_batch_size, per_step)
    if per_step % micro:
        parser.error(f"train.micro_batch_size {micro} must divide prompts x group = {per_step}")
    settings = dict(
        output_dir=str(out / "trl"),
        # one optimizer step per generation batch of prompts_per_step x group_size, in micro-batches
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=per_step // micro,
        steps_per_generation=per_step // micro,
        num_generations=r.group_size,
        max_prompt_length=r.max_prompt_tokens,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k if r.top_k > 0 else 0,
        learning_rate=t.lr,
        lr_scheduler_type="constant" if not t.warmup_steps else "constant_with_warmup",
        warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay,
        adam_epsilon=t.adam_eps,
        max_grad_norm=t.max_grad_norm,
        beta=a.beta,
        epsilon=a.eps_low,
        epsilon_high=a.eps_high,
        loss_type="dapo",  # token-mean over the batch, as ours with algo.skip_zero_variance_groups=false
        scale_rewards="group" if a.scale_rewards else "none",
        num_iterations=t.epochs,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        bf16=cuda,
        use_cpu=not cuda,
        max_steps=t.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=t.seed,
        reward_weights=[1.0, a.overlong_penalty] if a.overlong_buffer else None,
    )
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    dropped = sorted(k for k in settings if k not in known)
    if dropped:
        print(f"TRL {trl_version}'s GRPOConfig has no {dropped}: left at TRL's defaults", file=sys.stderr)
    config = GRPOConfig(**{k: v for k, v in settings.items() if k in known})
    clock = Clock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    # the task's reward (what our metrics.jsonl calls reward_mean), without the length penalty
    rewards = [
        row.get("rewards/task/mean", row["reward"]) for row in trainer.state.log_history if "reward" in row
    ]
    lengths = [row.get("completions/mean_length") for row in trainer.state.log_history if "reward" in row]
    result = {
        "trl": trl_version,
        "rows": clock.rows,
        "clock_s": clock.clock,  # per step, with the rewards and lengths TRL logged for that step
        "rewards": rewards,
        "response_len": lengths,
    }
    (out / "clock.json").write_text(json.dumps(result) + "\n")
    print("TRL_TTA " + json.dumps({"steps": len(rewards), "clock_s": clock.total}))


if __name__ == "__main__":
    main()
