"""``slime-gb10 train`` / ``eval`` / ``plot``.

Errors a user can fix (bad config keys, missing files, an empty dataset, a NaN loss, a missing
optional package) are ``UserError``s: ``slime_gb10.cli``'s one handler prints them as one clean
message, with no traceback unless -v. Ctrl-C, SIGTERM or SIGHUP
during training writes a checkpoint and exits with status 128 + the signal (130, 143, 129).
"""

from __future__ import annotations

import json
import logging
import sys
import types
import typing
from pathlib import Path

import click

from slime_gb10.grpo.config import (
    ConfigError,
    GRPOConfig,
    build_config,
    load_config_file,
    recipes,
    valid_keys,
)
from slime_gb10.utils.errors import VERBOSE

log = logging.getLogger("slime_gb10.grpo")


def _field(key: str):
    section, name = key.split(".")
    return GRPOConfig.model_fields[section].annotation.model_fields[name]


def _click_type(annotation):
    """click type of a config field: its Literal choices, else int / float / str (None stripped)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)])
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _click_type(args[0])
    return {int: int, float: float}.get(annotation, str)


def config_option(*flags: str, key: str):
    """A click option that sets config key ``key``: type, choices and help come from the config
    field (its description and default), so a setting is declared once, in grpo/config.py."""
    field = _field(key)

    def store(ctx: click.Context, _param, value):
        _store_override(ctx, key, value)

    default = "" if field.default is None else f"; default {field.default}"
    return click.option(
        *flags,
        type=_click_type(field.annotation),
        default=None,
        expose_value=False,
        callback=store,
        help=f"{field.description} [{key}{default}]",
    )


def _type_text(annotation) -> str:
    """A config field's type as --help shows it: int, int|null, auto|torch|sglang, list[str]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return "|".join(_type_text(a) for a in args)
    return str(annotation).replace("typing.", "") if origin else annotation.__name__


def settings_help() -> list[list[tuple[str, str]]]:
    """``(section.key, "description [type; default X]")`` of every config setting, one list per
    section, generated from the config models (the one declaration of each setting)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    for key in valid_keys():
        field = _field(key)
        value = field.get_default(call_default_factory=True)
        plain = isinstance(value, str) and value and not any(c.isspace() for c in value)
        default = value if plain else json.dumps(value)
        text = f"{field.description} [{_type_text(field.annotation)}; default {default}]"
        sections.setdefault(key.split(".")[0], []).append((key, text))
    return list(sections.values())


class _SettingsHelpCommand(click.Command):
    """A command whose --help ends with every config setting (:func:`settings_help`)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        sections = settings_help()
        # one column for all sections; a longer key puts its text on the next line
        width = min(30, max(len(key) for rows in sections for key, _ in rows))
        with formatter.section("Settings (keys of a --config file, or --set SECTION.KEY=VALUE)"):
            for number, rows in enumerate(sections):
                if number:
                    formatter.write_paragraph()
                formatter.write_dl([(key.ljust(width), text) for key, text in rows], col_max=width)


def _store_override(ctx: click.Context, key: str, value) -> None:
    if value is not None:
        ctx.meta.setdefault("config_overrides", {})[key] = value


def _remember_verbose(ctx: click.Context, _param, value: bool) -> bool:
    ctx.meta[VERBOSE] = value  # for the one error handler (slime_gb10.cli)
    return value


def _cli_overrides() -> dict:
    return dict(click.get_current_context().meta.get("config_overrides", {}))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("transformers", "urllib3", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _apply_runtime_fixes() -> None:
    try:
        from slime_gb10.platform.fixes import apply_runtime_fixes
    except ImportError:
        return
    apply_runtime_fixes(logger=log)


def _config_from_cli(
    config_file, sets, data_path=None, base_dir: Path | None = None, extra: dict | None = None
) -> GRPOConfig:
    """Defaults <- config file (or a resumed run's config.yaml) <- flags (``extra``) <- --set."""
    overrides = {**_cli_overrides(), **(extra or {})}
    if data_path is not None:
        overrides["data.task"] = "file"
        overrides["data.path"] = data_path
    file = config_file
    if file is None and base_dir is not None and (base_dir / "config.yaml").is_file():
        file = base_dir / "config.yaml"  # --resume: the run's own config, then the overrides
    return build_config(file, overrides, list(sets))


def _common_options(func):
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False),
            help=f"YAML/JSON config file, or a recipe name ({', '.join(recipes())}).",
        ),
        click.option(
            "--set",
            "sets",
            multiple=True,
            metavar="SECTION.KEY=VALUE",
            help="Override any config key (repeatable), e.g. --set algo.beta=0.01.",
        ),
        config_option("--model", key="model.name_or_path"),
        click.option(
            "--data",
            "data_path",
            type=click.Path(),
            help="Prompts: a JSONL/JSON/Parquet/CSV file, a dataset name (gsm8k) or hf:owner/name[:config] "
            "(default: the arithmetic task).",
        ),
        config_option("--device", key="backends.device"),
        config_option("--seed", key="train.seed"),
        click.option(
            "-v",
            "--verbose",
            is_flag=True,
            callback=_remember_verbose,
            help="Debug logging, and the traceback of an error.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command("train", cls=_SettingsHelpCommand)
@_common_options
@config_option("--output", key="output.dir")
@config_option("--steps", key="train.steps")
@config_option("--lr", key="train.lr")
@config_option("--prompts-per-step", key="rollout.prompts_per_step")
@config_option("--group-size", key="rollout.group_size")
@config_option("--max-new-tokens", key="rollout.max_new_tokens")
@config_option("--temperature", key="rollout.temperature")
@config_option("--rollout", "--rollout-engine", key="backends.rollout")
@config_option("--trainer", "--trainer-backend", key="backends.trainer")
@config_option("--eval-every", key="eval.every")
@config_option("--checkpoint-every", key="output.checkpoint_every")
@config_option("--reward", key="data.reward")
@config_option("--report-to", key="output.report_to")
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(file_okay=False),
    help="Continue the run in DIR from its newest readable checkpoint, or from the checkpoint "
    "directory DIR (RUN/checkpoints/step-N). --steps is the run's total, not extra steps.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Start a fresh run in an --output directory that holds a run, deleting that run's outputs.",
)
@click.option("--print-config", is_flag=True, help="Print the effective config as YAML and exit.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def train_command(config_file, sets, data_path, verbose, resume_dir, overwrite, print_config, no_progress):
    """GRPO post-training. No arguments: SmolLM2-135M-Instruct on the arithmetic task."""
    from slime_gb10.grpo.checkpoint import is_checkpoint_dir, run_dir_of

    run_dir = None
    if resume_dir is not None:
        run_dir = run_dir_of(resume_dir)
        output = _cli_overrides().get("output.dir")
        if output is not None and Path(output) != run_dir:
            raise ConfigError(
                f"--resume continues the run in {run_dir}; do not also pass a different --output"
            )
        if overwrite:
            raise ConfigError("--resume continues a run and --overwrite deletes it: pass one of them")
        click.get_current_context().meta.setdefault("config_overrides", {})["output.dir"] = str(run_dir)
    config = _config_from_cli(config_file, sets, data_path, run_dir)
    if no_progress:
        config.output.progress = False
    if print_config:
        click.echo(config.to_yaml(), nl=False)
        return
    _setup_logging(verbose)
    _apply_runtime_fixes()
    from slime_gb10.grpo.interrupts import signal_name, signal_of, stop_on_signals
    from slime_gb10.grpo.plot import run_summary
    from slime_gb10.grpo.trainer import GRPOTrainer, TrainingInterrupted

    trainer = GRPOTrainer(config)
    try:
        with stop_on_signals():  # while the model loads too: SIGTERM and SIGHUP stop like Ctrl-C
            resume = (Path(resume_dir) if is_checkpoint_dir(resume_dir) else True) if resume_dir else False
            trainer.setup(resume=resume, overwrite=overwrite)
            history = trainer.train()
    except TrainingInterrupted as exc:
        click.echo(exc.explain(config.output.dir), err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:  # during setup: no step yet, nothing to save
        way_on = f"continue with: slime-gb10 train --resume {resume_dir}" if resume_dir else "run it again"
        click.echo(
            f"\ninterrupted by {signal_name(signal_of(exc))} before the first step; {way_on}", err=True
        )
        sys.exit(128 + signal_of(exc))
    finally:
        trainer.close()
    if trainer.dist.is_main:  # the other ranks of a torchrun job have nothing to report
        click.echo(run_summary(history, Path(config.output.dir)))


def _num_prompts(value: str | None) -> int | str | None:
    if value is None:
        return "config"
    if value == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a number nor 'all'", param_hint="--num-prompts"
        ) from None
    return n  # below 1: the config says so, naming eval.num_prompts


@click.command("eval")
@_common_options
@config_option("--eval-data", key="data.eval_path")
@config_option("--k", key="eval.k")
@click.option(
    "--num-prompts",
    help=f"{_field('eval.num_prompts').description} A number or 'all'. "
    f"[eval.num_prompts; default {_field('eval.num_prompts').default}]",
)
@config_option("--max-new-tokens", key="eval.max_new_tokens")
@config_option("--temperature", key="eval.temperature")
@config_option("--batch-size", key="eval.batch_size")
@config_option("--rollout", "--rollout-engine", key="backends.rollout")
@click.option(
    "--output",
    "output_file",
    type=click.Path(dir_okay=False),
    help="Write the metrics and every question's outcome as JSON here (for `slime-gb10 compare`).",
)
def eval_command(config_file, sets, data_path, verbose, num_prompts, output_file):
    """Greedy pass@1 with its 95% interval, format compliance, response length (and pass@k)."""
    count = _num_prompts(num_prompts)
    overrides = {}
    if count != "config":
        overrides["eval.num_prompts"] = count
        if count is not None:
            overrides["data.eval_size"] = count
    config = _config_from_cli(config_file, sets, data_path, extra=overrides)
    _setup_logging(verbose)
    _apply_runtime_fixes()
    from slime_gb10.utils.atomic import atomic_write_text, ensure_writable_dir

    if output_file:  # before the eval, not after it: a bad path must not cost the run
        if Path(output_file).is_dir():
            raise ConfigError(f"--output '{output_file}' is a directory: name a .json file")
        ensure_writable_dir(Path(output_file).resolve().parent)
    result = run_eval(config)
    m = result.metrics
    click.echo(
        f"pass@1 (greedy) {m['pass@1']:.4f}  95% CI [{m['pass@1_ci_low']:.4f}, {m['pass@1_ci_high']:.4f}]  "
        f"on {int(m['num_prompts'])} questions"
    )
    for key, value in m.items():
        if not key.startswith("pass@1"):
            click.echo(f"{key:>20}: {value:.4f}")
    if output_file:
        document = {
            "model": config.model.name_or_path or "embedded SmolLM2-135M-Instruct",
            "data": config.data.eval_path or config.data.path or config.data.task,
            "metrics": m,
            "questions": result.questions,
        }
        atomic_write_text(output_file, json.dumps(document, indent=1) + "\n")
        click.echo(f"wrote {output_file}")


def run_eval(config: GRPOConfig):
    """Evaluate ``config.model`` on the held-out split of ``config.data``: an ``EvalResult``."""
    from slime_gb10.grpo import registry
    from slime_gb10.grpo.evaluate import evaluate_examples
    from slime_gb10.grpo.models import load_tokenizer, resolve_model_path
    from slime_gb10.grpo.prompts import PromptEncoder, load_splits
    from slime_gb10.grpo.rewards import get_reward

    _, examples = load_splits(config.data, config.train.seed)
    if not examples:
        raise ConfigError(
            "the held-out split is empty: set data.eval_size > 0, --eval-data, or --num-prompts"
        )
    reward_fn = get_reward(config.data.reward_spec())
    tokenizer = load_tokenizer(resolve_model_path(config.model.name_or_path), config.model.trust_remote_code)
    prompts = PromptEncoder.from_config(tokenizer, config)
    held_out = len(examples)
    examples = prompts.drop_long(examples, "eval")[: config.eval.num_prompts]
    if not examples:  # (found on the H200s: reasoning-gym's string_insertion prompts are ~300 tokens)
        raise ConfigError(
            f"every one of the {held_out} held-out prompts is longer than rollout.max_prompt_tokens="
            f"{config.rollout.max_prompt_tokens} tokens: raise it (--set rollout.max_prompt_tokens=...)"
        )
    device = registry.resolve_device(config.backends.device)
    engine_name = registry.resolve_engine(config.backends.rollout, device)
    log.info("eval of %d prompts with the %s rollout engine on %s", len(examples), engine_name, device)
    engine = registry.build_engine(engine_name, config, tokenizer, device)
    try:
        return evaluate_examples(engine, prompts, examples, reward_fn, config, seed=config.train.seed)
    finally:
        engine.shutdown()


@click.command("sft")
@_common_options
@click.option(
    "--output",
    callback=lambda ctx, _param, value: _store_override(ctx, "output.dir", value),
    expose_value=False,
    help="Run directory (default: the config's output.dir + '-sft', apart from train's).",
)
@config_option("--epochs", key="sft.epochs")
@config_option("--lr", key="sft.lr")
@config_option("--batch-size", key="sft.batch_size")
@config_option("--eval-data", key="data.eval_path")
@click.option("--overwrite", is_flag=True, help="Replace the run in --output (its outputs are deleted).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def sft_command(config_file, sets, data_path, verbose, overwrite, no_progress):
    """Supervised fine-tuning on the reference solutions (GSM8K's worked answers): a warm start for train."""
    from slime_gb10.grpo.interrupts import signal_name, signal_of, stop_on_signals
    from slime_gb10.grpo.sft import run_sft

    config = _config_from_cli(config_file, sets, data_path, None)
    if "output.dir" not in _cli_overrides() and not any(s.startswith("output.dir=") for s in sets):
        # not the config's own output.dir: that is where `train` with the same config writes
        config.output.dir = f"{config.output.dir}-sft"
    _setup_logging(verbose)
    _apply_runtime_fixes()
    try:
        with stop_on_signals():  # SIGTERM and SIGHUP stop like Ctrl-C
            got = run_sft(config, overwrite=overwrite, progress=config.output.progress and not no_progress)
    except KeyboardInterrupt as exc:
        click.echo(
            f"\ninterrupted by {signal_name(signal_of(exc))}: SFT writes no checkpoints; start it again "
            f"with --overwrite --output {config.output.dir}",
            err=True,
        )
        sys.exit(128 + signal_of(exc))
    click.echo(
        f"done: {got['steps']} steps on {got['examples']} solutions; held-out solution loss "
        f"{got['held_out_loss_before']:.4f} -> {got['held_out_loss_after']:.4f}"
    )
    click.echo(
        f"model: {got['final_model']} (GRPO from it: slime-gb10 train --model {got['final_model']} ...)"
    )


@click.command("compare")
@click.argument("first", type=click.Path(dir_okay=False))
@click.argument("second", type=click.Path(dir_okay=False))
def compare_command(first, second):
    """Paired comparison of two `eval --output` files on the same questions (McNemar's exact test)."""
    from slime_gb10.grpo.stats import compare_evaluations

    documents = []
    for path in (first, second):
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            document["questions"]
        except FileNotFoundError:
            raise click.ClickException(
                f"{path} does not exist; write it with slime-gb10 eval --output {path}"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise click.ClickException(
                f"{path} is not a `slime-gb10 eval --output` file (JSON with a 'questions' list)"
            ) from None
        documents.append(document)
    try:
        got = compare_evaluations(*documents)
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"cannot compare {first} and {second}: {exc}") from None
    click.echo(f"{got['questions']} questions in both")
    click.echo(
        f"pass@1 {got['pass@1_first']:.4f} -> {got['pass@1_second']:.4f} ({100 * got['difference']:+.2f} pp)"
    )
    click.echo(
        f"right in both {got['both_right']}, only first {got['only_first_right']}, "
        f"only second {got['only_second_right']}, neither {got['both_wrong']}"
    )
    click.echo(f"McNemar exact p = {got['mcnemar_p']:.3g}")
    if got["constant_answer"] is not None and got["constant_answer_rate"] is not None:
        click.echo(
            f"always answering {got['constant_answer']!r} would score {got['constant_answer_rate']:.4f}; "
            f"distinct right answers {got['distinct_right_first']} -> {got['distinct_right_second']}"
        )
        if got["pass@1_second"] <= got["constant_answer_rate"] and got["distinct_right_second"] <= 1:
            click.echo("warning: the second model scores no more than that one constant answer does")
    if "tasks" in got:
        click.echo(
            "| task | questions | pass@1 first | pass@1 second | change (pp) | McNemar p "
            "| only first / only second right | always the most common answer |"
        )
        click.echo("|---|---|---|---|---|---|---|---|")
        for task, g in got["tasks"].items():
            constant = (
                f"{g['constant_answer']!r}: {g['constant_answer_rate']:.3f}"
                if g["constant_answer_rate"] is not None
                else "-"
            )
            click.echo(
                f"| {task} | {g['questions']} | {g['pass@1_first']:.3f} | {g['pass@1_second']:.3f} "
                f"| {100 * g['difference']:+.1f} | {g['mcnemar_p']:.2g} "
                f"| {g['only_first_right']} / {g['only_second_right']} | {constant} |"
            )


@click.command("plot")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--out", "out_file", type=click.Path(dir_okay=False), help="PNG path (default: RUN_DIR/curves.png)."
)
def plot_command(run_dir, out_file):
    """Draw reward, length, entropy and KL curves of RUN_DIR/metrics.jsonl as a PNG."""
    from slime_gb10.grpo.plot import plot_run

    path = plot_run(run_dir, out_file)
    click.echo(f"wrote {path}")


__all__ = [
    "compare_command",
    "eval_command",
    "load_config_file",
    "plot_command",
    "sft_command",
    "train_command",
]
