"""TRL's ``GRPOTrainer`` on the same model, task, batch, group size and lengths as our trainer.

Only a benchmark: TRL is NOT a dependency of slime-gb10. The task is ours (the arithmetic
prompts of ``slime_gb10.grpo.arithmetic.ArithmeticTask``, the same instruction and chat template, the
same reward function), so the two runs differ only in the trainer. Prints one JSON line with the
per-step wall times measured by a callback (generation + reward + update, as TRL does them inside
``training_step``).

    python benchmarks/grpo/trl_grpo.py --model DIR --steps 8 --prompts 16 --group 8 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="HF model directory")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="completions per forward/backward (default: all at once)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the result JSON here too")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from slime_gb10.grpo.arithmetic import ArithmeticTask
    from slime_gb10.grpo.data import DEFAULT_INSTRUCTION
    from slime_gb10.grpo.rewards import arithmetic_reward

    cuda = torch.cuda.is_available()
    task = ArithmeticTask(seed=args.seed)
    examples = task.sample(args.prompts * (args.steps + 2))
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"{e.prompt.strip()}\n{DEFAULT_INSTRUCTION}"}],
                "ground_truth": e.ground_truth,
            }
            for e in examples
        ]
    )

    def reward(completions, ground_truth, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [arithmetic_reward(t, g) for t, g in zip(texts, ground_truth)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self._start = 0.0

        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self._start)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    completions_per_step = args.prompts * args.group
    micro = args.micro_batch or completions_per_step
    if completions_per_step % micro:
        parser.error(f"--micro-batch {micro} must divide prompts x group = {completions_per_step}")
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        # one optimizer step per generation batch of completions_per_step, in micro-batches
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions_per_step // micro,
        steps_per_generation=completions_per_step // micro,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # token-mean, as ours
        scale_rewards="group",
        num_iterations=1,
        gradient_checkpointing=False,
        bf16=cuda,
        use_cpu=not cuda,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=args.seed,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    lengths = [row.get("completions/mean_length") for row in trainer.state.log_history if "reward" in row]
    steady = timer.times[2:] if len(timer.times) > 3 else timer.times
    result = {
        "trainer": "trl",
        "trl_version": __import__("trl").__version__,
        "steps": len(timer.times),
        "step_times_s": timer.times,
        "step_time_median_s": statistics.median(steady),
        "rewards": rewards,
        "response_len": lengths,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    line = json.dumps(result)
    print("TRL_RESULT " + line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
