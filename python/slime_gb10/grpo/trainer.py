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

import json
import logging
import math
import shutil
import time
from pathlib import Path

import torch

from slime_gb10.grpo import distributed, interrupts
from slime_gb10.grpo.batching import Sample, collate, split_microbatches
from slime_gb10.grpo.config import GRPOConfig
from slime_gb10.grpo.interfaces import Generation, SamplingParams
from slime_gb10.grpo.interrupts import TrainingInterrupted  # noqa: F401  (the CLI's and tests' name)
from slime_gb10.grpo.metrics import NullLogger, eval_summary, progress_fields, step_mfu, step_row
from slime_gb10.grpo.prompts import PromptEncoder, load_splits
from slime_gb10.utils.errors import UserError

log = logging.getLogger(__name__)


class TrainingDiverged(UserError, RuntimeError):
    """NaN/Inf loss or gradient norm; the message names the step and the last good checkpoint."""


class DataError(UserError, ValueError):
    """The prompts cannot be used (empty, too long...)."""


def step_seed(seed: int, step: int) -> int:
    """A distinct, reproducible sampling seed per step (resume-safe: no hidden RNG state)."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)


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
        self._failed_reward_steps = 0  # consecutive steps whose every reward failed
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
        from slime_gb10.grpo import checkpoint as ckpt
        from slime_gb10.grpo import memory_plan, registry
        from slime_gb10.grpo.metrics import (
            METRICS_FILE,
            SAMPLES_FILE,
            RunLogger,
            require_reporter,
            truncate_after,
        )
        from slime_gb10.grpo.models import check_context_fits, load_tokenizer, resolve_model_path
        from slime_gb10.grpo.rewards import get_reward
        from slime_gb10.utils.atomic import atomic_write_text

        cfg = self.config
        resumed = None
        if resume:  # read the checkpoint (as data) before loading any model: fail early
            resumed = ckpt.load_for_resume(self.run_dir if resume is True else Path(resume))
        require_reporter(cfg.output.report_to)
        torch.manual_seed(cfg.train.seed)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self._build_data()
        self.reward_fn = get_reward(cfg.data.reward_spec())
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(
                resolve_model_path(cfg.model.name_or_path), cfg.model.trust_remote_code
            )
        self.prompts = PromptEncoder.from_config(self.tokenizer, cfg)
        if self.engine is None or self.backend is None:
            check_context_fits(cfg)  # before any weights load: a too long sequence would crash mid-run
            memory_plan.check_run(self)  # the estimated peak must fit the free memory (issue #41)
            self.engine, self.backend, self.choice, self.device = registry.build_pair(cfg, self.tokenizer)
        self._build_sampler()
        self.device = self.device or getattr(self.backend, "device", torch.device("cpu"))
        self.pad_token_id = self.tokenizer.pad_token_id

        if resumed is not None:
            path, policy_state, trainer_state = resumed
            saved_world = int(trainer_state.get("world_size", 1))
            if saved_world != self.dist.world_size:
                raise ckpt.CheckpointError(
                    f"checkpoint '{path}' was written by {saved_world} rank(s) and holds each one's RNG state; "
                    f"resume it with {saved_world} (torchrun --nproc-per-node {saved_world}), not {self.dist.world_size}"
                )
            try:
                self.backend.load_state_dict(policy_state)
                self.sampler.load_state_dict(trainer_state["sampler"])
                ranks = trainer_state.get("rank_rng") or [trainer_state["rng"]]
                ckpt.set_rng_state(ranks[self.dist.rank])
            except (KeyError, ValueError, RuntimeError, TypeError) as exc:
                raise ckpt.CheckpointError(
                    f"checkpoint '{path}' does not fit this run: {str(exc).strip().splitlines()[0]}"
                ) from exc
            del policy_state
            self.step = int(trainer_state["step"])
            # Resuming at step N discards what came after it: metrics, samples and any newer
            # checkpoint (a save of step N + k must never find the discarded one in its place).
            # Rank 0 alone: another rank's atomic rewrite could replace the file rank 0 appends to.
            for later_step, later in ckpt.list_checkpoints(self.run_dir) if self.dist.is_main else []:
                if later_step > self.step:
                    log.warning("removing checkpoint %s: the run resumes from step %d", later, self.step)
                    shutil.rmtree(later)
            if self.dist.is_main:
                truncate_after(self.run_dir / METRICS_FILE, self.step)
                truncate_after(self.run_dir / SAMPLES_FILE, self.step)
            self._last_checkpoint = path
            log.info("resumed from %s (step %d)", path, self.step)
        if self.dist.is_main:
            atomic_write_text(self.run_dir / "config.yaml", cfg.to_yaml())
            self.logger = RunLogger(self.run_dir, cfg.output.report_to, cfg.model_dump(mode="json"))
        else:
            self.logger = NullLogger()
        if self.dist.enabled:  # every rank sums its gradients with the others before clipping
            self.backend.grad_sync = self.dist.all_reduce_gradients
        self.dist.agree_on_weights(self.backend, cfg.model.name_or_path, cfg.rollout.weight_bucket_mb * 2**20)
        self._sync_weights()  # the engine starts from exactly the trainer's weights
        self._boundary = self._snapshot()

    def _build_data(self) -> None:
        cfg = self.config.data
        splits = load_splits(cfg, self.config.train.seed)  # the same on every rank, or all refuse
        self._train_source, self.eval_examples = self.dist.agreed_data(cfg, splits)
        if isinstance(self._train_source, list) and not self._train_source:
            raise DataError(
                f"no training prompts left in '{cfg.path}' after holding out {cfg.eval_size} for eval"
            )

    def _build_sampler(self) -> None:
        from slime_gb10.grpo import data

        source = self._train_source
        if isinstance(source, list):
            source = self.prompts.drop_long(source, "training")
            if not source:
                raise DataError(
                    f"every training prompt is longer than rollout.max_prompt_tokens="
                    f"{self.config.rollout.max_prompt_tokens}; raise it"
                )
        self.eval_examples = self.prompts.drop_long(self.eval_examples, "eval")
        self.sampler = data.PromptSampler(
            source,
            batch_size=self.config.rollout.prompts_per_step,
            seed=self.config.train.seed,
            order=self.config.data.order,
        )

    # ------------------------------------------------------------------ helpers
    def prompt_ids(self, example) -> list[int]:
        return self.prompts.ids(example)

    def opens_think(self, example) -> bool:
        """Whether ``example``'s formatted prompt ends in an open ``<think>`` (see rewards.as_scored)."""
        return self.prompts.opens_think(example)

    def _sampling_params(self, seed: int | None) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            stop=tuple(r.stop),
            stop_regex=tuple(r.stop_regex),
            seed=seed,
        )

    def _sync_weights(self) -> float:
        start = time.perf_counter()
        self.engine.update_weights(self.backend.export_weights(self.config.rollout.weight_bucket_mb * 2**20))
        return time.perf_counter() - start

    def _snapshot(self) -> dict:
        from slime_gb10.grpo.checkpoint import rng_state

        return {"step": self.step, "sampler": self.sampler.state_dict(), "rng": rng_state()}

    def save(self, reason: str = "periodic", prune: bool = True) -> Path:
        from slime_gb10.grpo.checkpoint import checkpoint_path, save_checkpoint

        assert self._boundary is not None and self._boundary["step"] == self.step
        state = {**self._boundary, "world_size": self.dist.world_size}
        if self.dist.enabled:  # every rank's RNG state; rank 0 writes (a collective: all ranks call save)
            state["rank_rng"] = self.dist.gather(self._boundary["rng"])
        path = checkpoint_path(self.run_dir, self.step)  # where rank 0 writes it
        if self.dist.is_main:
            path = save_checkpoint(
                self.run_dir,
                self.step,
                self.backend.state_dict(),
                state,
                keep=self.config.output.keep_checkpoints if prune else 1 << 30,
                reason=reason,
            )
        self.dist.barrier()
        self._last_checkpoint = path
        return path

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
                    start = time.perf_counter()
                    row = {"step": 0, **{f"eval/{k}": v for k, v in self.run_eval().metrics.items()}}
                    row["eval_time_s"] = time.perf_counter() - start
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
                        self.save("final" if self.step == cfg.train.steps else "periodic")
            finally:
                if progress is not None:
                    progress.close()
            final_eval_owed = history or not (self.run_dir / "eval_final.json").exists()  # (resumed)
            if cfg.eval.at_end and final_eval_owed and self.eval_examples and self.dist.is_main:
                self._final_eval()
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
        from slime_gb10.grpo import algo
        from slime_gb10.grpo.rewards import as_scored, safe_rewards

        cfg = self.config
        G = cfg.rollout.group_size
        step = self.step + 1
        cuda = self.device is not None and self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t_step = time.perf_counter()

        # 1. prompts and rollouts (this rank's share; row i of the global batch samples with seed + i)
        examples = self.dist.shard(list(self._next_examples()))
        prompts = [self.prompt_ids(e) for e in examples]
        repeated = [p for p in prompts for _ in range(G)]
        truths = [str(e.ground_truth) for e in examples for _ in range(G)]
        self.engine.wake()
        t0 = time.perf_counter()
        seed = step_seed(cfg.train.seed, step) + self.dist.rank * len(repeated)
        generations: list[Generation] = self.engine.generate(repeated, self._sampling_params(seed))
        rollout_time = time.perf_counter() - t0
        self.engine.sleep()

        # 2. rewards and group advantages
        opens = [self.opens_think(e) for e in examples for _ in range(G)]
        scored = [as_scored(g.text, o) for g, o in zip(generations, opens, strict=True)]
        rewards, reward_errors = safe_rewards(self.reward_fn, scored, truths)
        self._check_reward_failures(reward_errors, len(rewards), step)
        # the length remedies (algo.truncated_reward, algo.overlong_buffer): what advantages see
        shaping = {
            "lengths": torch.tensor([len(g.completion_ids) for g in generations]),
            "truncated": torch.tensor([g.truncated for g in generations]),
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "truncated_reward": cfg.algo.truncated_reward,
        }
        task_t = torch.tensor(rewards, dtype=torch.float32)
        reward_t = algo.shape_rewards(
            task_t,
            **shaping,
            overlong_buffer=cfg.algo.overlong_buffer,
            overlong_factor=cfg.algo.overlong_penalty,
        )
        advantages = algo.group_advantages(reward_t, G, scale_std=cfg.algo.scale_rewards)
        # A group without signal is one whose answers score alike (DAPO's dynamic sampling filters on
        # accuracy, as verl does): the overlong penalty alone must not keep an all-right group whose
        # one long answer would then get the advantage of a wrong one.
        zero_var = algo.zero_variance_groups(algo.shape_rewards(task_t, **shaping), G)

        samples = [
            Sample(
                prompt_ids=list(g.prompt_ids),
                completion_ids=list(g.completion_ids),
                rollout_logprobs=list(g.completion_logprobs),
                advantage=float(advantages[i]),
                reward=rewards[i],
                truncated=g.truncated,
                # DAPO's overlong filtering (Yu et al. 2025, sec. 3.4): a completion cut at the
                # budget has no final answer; its reward would punish length, not reasoning
                train=not (cfg.algo.mask_truncated and g.truncated),
            )
            for i, g in enumerate(generations)
        ]
        # Groups where every sample got the same reward have zero advantage: no gradient, skip them.
        skip = cfg.algo.skip_zero_variance_groups and cfg.algo.beta == 0 and cfg.algo.entropy_coef == 0
        trainable = [
            s
            for i, s in enumerate(samples)
            if not (skip and bool(zero_var[i // G])) and s.train and s.completion_ids
        ]

        # 3.-6. From the first optimizer update until the row is logged, a signal waits for the
        # step to finish (finish_step_before_interrupt), so a checkpoint is always a step boundary.
        with interrupts.finish_step_before_interrupt():
            self._mid_step = True
            # 3. policy update
            t1 = time.perf_counter()
            # No trainable sample (every group had zero variance): no update, and no loss or
            # gradient norm to report (NaN -> null in metrics.jsonl, a gap in curves.png).
            anywhere = self.dist.sum([len(trainable)])[0] > 0  # all ranks update, or none
            train_metrics, train_tokens, grad_norm, loss = (
                self._update(trainable) if anywhere else ({}, 0, math.nan, math.nan)
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
            row = step_row(
                step,
                self.dist.gather(
                    {
                        "rewards": rewards,
                        "shaped_rewards": reward_t.tolist(),
                        "lengths": [len(g.completion_ids) for g in generations],
                        "truncated": [g.truncated for g in generations],
                        "zero_variance": zero_var.tolist(),
                        "reward_errors": reward_errors,
                        "train_metrics": train_metrics,
                        "train_tokens": train_tokens,
                        "loss": loss,
                        "times": times,
                    }
                ),
                pass_threshold=cfg.data.pass_threshold,
                lr=cfg.train.lr,
                grad_norm=grad_norm,
                engine_stats=self.engine.stats(),
                backend_stats=self.backend.stats(),
            )
            if cuda:
                row["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            mfu = step_mfu(
                self.device,
                getattr(self.backend, "num_parameters", None),
                prompt_tokens=sum(len(p) for p in repeated),
                rollout_tokens=sum(len(g.completion_ids) for g in generations),
                train_tokens=train_tokens,
                seconds=row["step_time_s"],
            )
            if mfu is not None:
                row["mfu"] = mfu

            # 6. evaluation
            if cfg.eval.every and step % cfg.eval.every == 0 and self.eval_examples and self.dist.is_main:
                t2 = time.perf_counter()
                for key, value in self.run_eval().metrics.items():
                    row[f"eval/{key}"] = value
                row["eval_time_s"] = time.perf_counter() - t2
                log.info("step %d eval: %s", step, eval_summary(row))

            self.logger.log_step(row)
            if cfg.output.samples_per_step:
                self.logger.log_samples(
                    [
                        {
                            "step": step,
                            "prompt": self.tokenizer.decode(g.prompt_ids, skip_special_tokens=False),
                            "completion": g.text,
                            "reward": rewards[i],
                            "ground_truth": truths[i],
                            "finish_reason": g.finish_reason,
                        }
                        for i, g in list(enumerate(generations))[:: max(1, G)][: cfg.output.samples_per_step]
                    ]
                )
            return row

    def _check_reward_failures(self, errors: int, total: int, step: int) -> None:
        """Stop a run whose reward failed on every sample for ``data.max_failed_reward_steps`` steps."""
        from slime_gb10.grpo.rewards import RewardError

        self._failed_reward_steps = self._failed_reward_steps + 1 if errors == total else 0
        limit = self.config.data.max_failed_reward_steps
        if self._failed_reward_steps >= limit:
            name = getattr(self.reward_fn, "__name__", "the reward")
            raise RewardError(
                f"step {step}: reward {name} failed on every sample for {limit} steps in a row (the first "
                "error is logged above), so there is nothing to learn from; fix the reward or the data "
                "(data.reward, the ground-truth column) and start again"
            )

    def _next_examples(self):
        batch = self.sampler.next_batch()
        if not batch:
            raise DataError("the prompt sampler returned no prompts (empty dataset?)")
        return batch

    def _update(self, samples: list[Sample]) -> tuple[dict, int, float, float]:
        """All optimizer steps of one GRPO step; returns (metrics, tokens processed, grad_norm, loss)."""
        from slime_gb10.grpo import algo

        cfg = self.config
        on_policy = cfg.train.epochs == 1 and cfg.train.minibatches == 1
        need_ref = cfg.algo.beta > 0 or cfg.algo.ref_kl_metric
        if need_ref and not _has_reference_model(self.backend):
            if cfg.algo.beta > 0:
                raise RuntimeError("algo.beta > 0 needs a backend with reference_logprobs()")
            need_ref = False

        # several ranks: the same number of optimizer steps everywhere, even with few local samples
        minibatch_count = (
            cfg.train.minibatches if self.dist.enabled else min(cfg.train.minibatches, len(samples))
        )
        # Deterministic split into minibatches (every minibatch-th sample), each cut into microbatches.
        minibatches = [samples[i::minibatch_count] for i in range(minibatch_count)]
        prepared, counts = [], []
        for mb in minibatches:
            micro = []
            for group in split_microbatches(mb, cfg.train.micro_batch_size):
                batch, extras = collate(group, self.pad_token_id)
                if not on_policy:
                    extras["old_logprobs"], _ = self.backend.logprobs(batch)
                if need_ref:
                    extras["ref_logprobs"] = self.backend.reference_logprobs(batch)
                micro.append((batch, extras))
            if cfg.algo.loss_agg == "token-mean":
                counts.append(float(sum(float(b.completion_mask.sum()) for b, _ in micro)))
            else:
                counts.append(float(sum(b.input_ids.shape[0] for b, _ in micro)))
            prepared.append(micro)
        # the loss of every rank is divided by the count of the whole global minibatch
        for micro, count in zip(prepared, self.dist.sum(counts), strict=True):
            for _, extras in micro:
                extras["global_count"] = max(count, 1.0)

        loss_fn = algo.GRPOLoss.from_config(cfg.algo, cfg.rollout.max_new_tokens)

        tokens = 0
        sums: dict[str, float] = {}
        grad_norms, losses = [], []
        for _ in range(cfg.train.epochs):
            for micro in prepared:
                result = self.backend.train_step(micro, loss_fn)
                grad_norms.append(result.grad_norm)
                losses.append(result.loss)
                for key, value in result.metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                tokens += sum(int(b.attention_mask.sum()) for b, _ in micro)
        steps = len(grad_norms)
        metrics = {k: v / steps for k, v in sums.items()}
        return metrics, tokens, sum(grad_norms) / steps, sum(losses) / steps

    def run_eval(self, num_prompts: int | str | None = "config"):
        """Evaluate the current policy on the held-out examples (``eval.num_prompts`` of them, or
        ``num_prompts``; None: all); an :class:`~slime_gb10.grpo.evaluate.EvalResult`."""
        from slime_gb10.grpo.evaluate import evaluate_examples

        cfg = self.config
        count = cfg.eval.num_prompts if num_prompts == "config" else num_prompts
        self.engine.wake()
        try:
            return evaluate_examples(
                self.engine,
                self.prompts,
                self.eval_examples[:count],
                self.reward_fn,
                cfg,
                seed=step_seed(cfg.train.seed + 1, self.step),
            )
        finally:
            self.engine.sleep()

    def _final_eval(self) -> None:
        """``eval.at_end``: the whole held-out split after the last step -> metrics row + eval_final.json."""
        from slime_gb10.utils.atomic import atomic_write_text

        start = time.perf_counter()
        result = self.run_eval(num_prompts=None)
        row = {"step": self.step, **{f"final_eval/{k}": v for k, v in result.metrics.items()}}
        row["final_eval_time_s"] = time.perf_counter() - start
        self.logger.log_step(row)
        atomic_write_text(
            self.run_dir / "eval_final.json",
            json.dumps(
                {"step": self.step, "metrics": result.metrics, "questions": result.questions}, indent=1
            )
            + "\n",
        )
        log.info(
            "final eval on all %d held-out prompts: pass@1 %.4f [%.4f, %.4f], format %.3f (%.0f s)",
            len(result.questions),
            result.metrics["pass@1"],
            result.metrics["pass@1_ci_low"],
            result.metrics["pass@1_ci_high"],
            result.metrics["format_rate"],
            row["final_eval_time_s"],
        )


def _has_reference_model(backend) -> bool:
    """True when the backend overrides ``PolicyBackend.reference_logprobs`` (keeps a frozen reference)."""
    from slime_gb10.grpo.interfaces import PolicyBackend

    method = getattr(type(backend), "reference_logprobs", None)
    return method is not None and method is not PolicyBackend.reference_logprobs
