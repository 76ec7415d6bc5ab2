"""The GRPO loop: one controller, rollout engine and policy colocated on one device.

Each step::

    prompts  = sampler.next()                          # P prompts
    samples  = engine.generate(prompts x G)            # G completions each, with logprobs
    rewards  = reward_fn(samples)                      # rule-based
    A        = group_advantages(rewards, G)            # (r - mean) / std per group
    for epoch, minibatch:                              # usually 1 x 1: one on-policy step
        backend.train_step(minibatch, grpo_loss)       # clipped surrogate (+ KL, TIS)
    engine.update_weights(backend.export_weights())    # weight sync through a chunk stream

plus evaluation every ``eval.every`` steps and a checkpoint every ``output.checkpoint_every``, one
before ``final_model/`` and one on Ctrl-C, SIGTERM or SIGHUP (:mod:`slime_gb10.grpo.interrupts`).
Under ``torchrun`` each rank runs this loop on its share of the prompts
(:mod:`slime_gb10.grpo.distributed`); rank 0 writes the run.
With one epoch and one minibatch the "old" policy of the PPO ratio IS the current one, so its
logprobs are the detached current logprobs (no extra forward; the ratio is 1 and the gradient
is the plain policy gradient); otherwise they are computed once before the first update.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch

from slime_gb10.grpo import checkpoint, distributed, interrupts
from slime_gb10.grpo.batching import update_policy
from slime_gb10.grpo.config import GRPOConfig
from slime_gb10.grpo.data import DatasetError
from slime_gb10.grpo.evaluate import eval_run, final_eval
from slime_gb10.grpo.interfaces import SamplingParams, step_seed
from slime_gb10.grpo.interrupts import TrainingInterrupted  # noqa: F401  (the CLI's and tests' name)
from slime_gb10.grpo.metrics import NullLogger, eval_summary, progress_fields, sample_rows, step_mfu, step_row
from slime_gb10.grpo.prompts import PromptEncoder, run_sampler, run_splits
from slime_gb10.grpo.scoring import score_generations
from slime_gb10.utils.errors import UserError

log = logging.getLogger(__name__)


class TrainingDiverged(UserError, RuntimeError):
    """NaN/Inf loss or gradient norm; the message names the step and the last good checkpoint."""


# ---------------------------------------------------------------------------------- trainer
class GRPOTrainer:
    def __init__(
        self,
        config: GRPOConfig,
        *,
        tokenizer=None,
        engine=None,
        backend=None,
        device: torch.device | None = None,
    ):
        self.config = config
        self.run_dir = Path(config.output.dir)
        self.tokenizer = tokenizer
        self.engine = engine
        self.backend = backend
        self.device = device
        self.step = 0
        self.logger = None
        self.prompts = None  # prompts.PromptEncoder, once the tokenizer is known
        self._boundary: dict | None = None
        self._last_checkpoint: Path | None = None
        self._mid_step = False  # inside a step's update..log: memory is not a step boundary
        self._reward_failures = None  # rewards.FailureStreak, once the reward is known
        self._run = None  # the locked run directory (rundir.RunDirectory), from setup() to close()
        self.dist = distributed.DistContext()  # rank and world size under torchrun (set in setup)

    # ------------------------------------------------------------------ setup
    def setup(self, resume: bool | str | Path = False, *, overwrite: bool = False) -> None:
        """Open and lock the run directory, load data, model, engine and (``resume``) a checkpoint.

        ``resume``: True continues from the run directory's newest readable checkpoint; a path
        continues from that checkpoint directory. ``overwrite`` deletes a previous run's outputs
        in the directory (without it, a fresh run into a used directory is refused). If setup
        fails, a directory it created is removed again.
        """
        from slime_gb10.grpo.rundir import open_run_dir
        from slime_gb10.utils.atomic import OutputPathError

        self.dist = distributed.init(self.config)  # refuses a bad launch before anything loads
        problem = None
        if self.dist.is_main:  # rank 0 alone owns the run directory
            try:
                self._run = open_run_dir(self.run_dir, resume=bool(resume), overwrite=overwrite)
            except OutputPathError as exc:
                problem = exc
        if any(self.dist.gather(None if problem is None else str(problem))):
            raise problem or OutputPathError(f"rank 0 could not open the run directory '{self.run_dir}'")
        try:
            self._setup(resume)
        except BaseException:
            if self._run is not None:
                self._run.abandon()
            self._run = None
            raise

    def _setup(self, resume: bool | str | Path) -> None:
        from slime_gb10.grpo import memory_plan, registry
        from slime_gb10.grpo.metrics import RunLogger, require_reporter
        from slime_gb10.grpo.models import check_context_fits, load_tokenizer, resolve_model_path
        from slime_gb10.grpo.rewards import FailureStreak, get_reward

        cfg = self.config
        if cfg.train.sharding == "fsdp" and self.dist.enabled:  # before anything trains or loads
            from slime_gb10.grpo.sharded_checkpoint import unseen_by
            from slime_gb10.utils.atomic import OutputPathError

            problem = unseen_by(self.run_dir, self.dist)
            if problem:
                raise OutputPathError(problem)
        resumed = None
        if resume:  # read the checkpoint (as data) before loading any model: fail early
            resumed = checkpoint.agreed_resume(self.run_dir if resume is True else Path(resume), self.dist)
        require_reporter(cfg.output.report_to)
        torch.manual_seed(cfg.train.seed)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.reward_fn = get_reward(cfg.data.reward_spec())
        self._reward_failures = FailureStreak(cfg.data.max_failed_reward_steps, self.reward_fn)
        self._train_source, self.eval_examples = run_splits(cfg, self.dist)  # the same on every rank
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(
                resolve_model_path(cfg.model.name_or_path), cfg.model.trust_remote_code
            )
        build = self.engine is None or self.backend is None
        if build:
            check_context_fits(cfg)  # before any weights load: a too long sequence would crash mid-run
        self.prompts = PromptEncoder.from_config(self.tokenizer, cfg)
        self.sampler, self.eval_examples = run_sampler(
            cfg, self.prompts, self._train_source, self.eval_examples
        )
        if build:
            memory_plan.check_run(self)  # the estimated peak must fit the free memory (issue #41)
            self.engine, self.backend, self.choice, self.device = registry.build_pair(cfg, self.tokenizer)
        self.device = self.device or getattr(self.backend, "device", torch.device("cpu"))
        self.pad_token_id = self.tokenizer.pad_token_id
        if resumed is not None:
            checkpoint.restore(self, resumed)  # weights, sampler, RNG, step
            resumed = None
        self.dist.agree_on_weights(
            self.backend, cfg, getattr(self, "choice", None)
        )  # before any file changes
        if self.step:
            checkpoint.discard_after(self)  # a resumed run: the outputs of later steps go
        if self.dist.is_main:
            self.logger = RunLogger.open(self.run_dir, cfg)
        else:
            self.logger = NullLogger()
        if self.dist.enabled and hasattr(self.backend, "grad_sync"):  # Megatron's DDP reduces its own
            self.backend.grad_sync = self.dist.all_reduce_gradients  # sum the ranks' gradients, then clip
        self._sync_weights()  # the engine starts from exactly the trainer's weights
        self._boundary = self._snapshot()

    # ------------------------------------------------------------------ helpers
    def _sync_weights(self) -> float:
        start = time.perf_counter()
        stream = self.backend.export_weights(
            self.config.rollout.weight_bucket_mb * 2**20, nvfp4_codes=self.engine.receives_nvfp4_codes
        )
        self.engine.update_weights(stream)
        return time.perf_counter() - start

    def _snapshot(self) -> dict:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "rng": checkpoint.rng_state()}

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict]:
        """Steps up to ``train.steps``, then the final eval and ``final_model/``. Ctrl-C, SIGTERM or
        SIGHUP anywhere in it: a checkpoint when memory is a step boundary, then TrainingInterrupted."""
        from slime_gb10.grpo.backends.common import NonFiniteError

        cfg = self.config
        history: list[dict] = []
        progress = None
        if cfg.output.progress and self.dist.is_main:
            from tqdm.auto import tqdm

            progress = tqdm(
                total=cfg.train.steps, initial=self.step, desc="GRPO", unit="step", dynamic_ncols=True
            )
        at_start = cfg.eval.every and cfg.eval.at_start and self.step == 0 and self.eval_examples
        with interrupts.stop_on_signals(), interrupts.checkpoint_on_interrupt(self):
            try:
                if at_start and self.dist.is_main:
                    row = {"step": 0, **eval_run(self, cfg.eval.num_prompts)[0]}
                    self.logger.log_step(row)
                    log.info("step 0 eval: %s", eval_summary(row))
                while self.step < cfg.train.steps:
                    try:
                        row = self.train_step()
                    except NonFiniteError as exc:
                        where = self._last_checkpoint or "none written yet"
                        raise TrainingDiverged(
                            f"step {self.step + 1}: {exc}. Training stopped; nothing was saved from this step "
                            f"(with train.minibatches > 1 the weights in memory may be partly updated). "
                            f"Last good checkpoint: {where}. Lower train.lr (or train.max_grad_norm), then --resume."
                        ) from exc
                    history.append(row)
                    if progress is not None:
                        progress.update(1)
                        progress.set_postfix(progress_fields(row))
                    every = cfg.output.checkpoint_every
                    if every and (self.step % every == 0 or self.step == cfg.train.steps):
                        checkpoint.save(self, "final" if self.step == cfg.train.steps else "periodic")
            finally:
                if progress is not None:
                    progress.close()
            final_eval_owed = history or not (self.run_dir / "eval_final.json").exists()  # (resumed)
            if cfg.eval.at_end and final_eval_owed and self.eval_examples and self.dist.is_main:
                final_eval(self)
            interrupts.write_final_model(self)  # a checkpoint of the last step first, then final_model/
        self.dist.barrier()
        return history

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
        if self.engine is not None:
            self.engine.shutdown()
        if self._run is not None:
            self._run.close()
            self._run = None
        if self.dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def train_step(self) -> dict:
        """One GRPO step; returns (and logs) its metrics row."""
        cfg = self.config
        G = cfg.rollout.group_size
        step = self.step + 1
        cuda = self.device is not None and self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t_step = time.perf_counter()

        # 1. prompts and rollouts (this rank's share; row i of the global batch samples with seed + i)
        batch = self.sampler.next_batch()
        if not batch:
            raise DatasetError("the prompt sampler returned no prompts (empty dataset?)")
        examples = self.dist.shard(list(batch))
        repeated = [self.prompts.ids(e) for e in examples for _ in range(G)]
        opens = [self.prompts.opens_think(e) for e in examples for _ in range(G)]
        truths = [str(e.ground_truth) for e in examples for _ in range(G)]
        self.engine.wake()
        t0 = time.perf_counter()
        seed = step_seed(cfg.train.seed, step) + self.dist.rank * len(repeated)
        generations = self.engine.generate(repeated, SamplingParams.of_rollout(cfg.rollout, seed))
        rollout_time = time.perf_counter() - t0
        self.engine.sleep()

        # 2. rewards, the length remedies, group advantages, the samples to train on
        scored = score_generations(generations, truths, opens, self.reward_fn, cfg)
        self._reward_failures.check(scored.reward_errors, len(scored.rewards), step)

        # 3.-6. From the first optimizer update until the row is logged, a signal waits for the
        # step to finish (finish_step_before_interrupt), so a checkpoint is always a step boundary.
        with interrupts.finish_step_before_interrupt():
            self._mid_step = True
            # 3. policy update. No trainable sample anywhere (every group had zero variance): no
            # update, and no loss or gradient norm to report (NaN -> null in metrics.jsonl).
            t1 = time.perf_counter()
            anywhere = self.dist.sum([len(scored.trainable)])[0] > 0  # all ranks update, or none
            train_metrics, train_tokens, grad_norm, loss = (
                update_policy(self.backend, scored.trainable, cfg, self.dist, self.pad_token_id)
                if anywhere
                else ({}, 0, math.nan, math.nan)
            )
            train_time = time.perf_counter() - t1
            # The optimizer step is done: this step now counts.
            self._boundary = {**self._snapshot(), "step": step}
            self.step = step
            self._mid_step = False  # a boundary again: a second signal from here on saves this step

            # 4. weight sync
            sync_time = self._sync_weights() if anywhere else 0.0

            # 5. metrics (of the global batch: every rank's numbers gathered)
            times = {"rollout": rollout_time, "train": train_time, "sync": sync_time}
            times["step"] = time.perf_counter() - t_step
            lengths = [len(g.completion_ids) for g in generations]
            part = {
                "rewards": scored.rewards,
                "shaped_rewards": scored.shaped.tolist(),
                "lengths": lengths,
                "truncated": [g.truncated for g in generations],
                "zero_variance": scored.zero_variance.tolist(),
                "reward_errors": scored.reward_errors,
                "train_metrics": train_metrics,
                "train_tokens": train_tokens,
                "loss": loss,
                "times": times,
            }
            row = step_row(
                step,
                self.dist.gather(part),
                pass_threshold=cfg.data.pass_threshold,
                lr=cfg.train.lr,
                grad_norm=grad_norm,
                engine_stats=self.engine.stats(),
                backend_stats=self.backend.stats(),
            )
            samples = sample_rows(
                step, generations, scored.rewards, truths, self.tokenizer, G, cfg.output.samples_per_step
            )
            if cuda:
                row["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            mfu = step_mfu(
                self.device,
                getattr(self.backend, "num_parameters", None),
                prompt_tokens=sum(map(len, repeated)),
                rollout_tokens=sum(lengths),
                # tensor parallelism: this rank computed 1/tp of each of its group's trained tokens
                train_tokens=train_tokens / getattr(self.backend, "tensor_parallel_size", 1),
                seconds=row["step_time_s"],
            )
            if mfu is not None:
                row["mfu"] = mfu

            # 6. evaluation
            if cfg.eval.every and step % cfg.eval.every == 0 and self.eval_examples and self.dist.is_main:
                row.update(eval_run(self, cfg.eval.num_prompts)[0])
                log.info("step %d eval: %s", step, eval_summary(row))

            self.logger.log_step(row)
            self.logger.log_samples(samples)
            return row
