"""The ``slime-gb10`` command line.

Subcommands live next to the code they drive and are imported only when used, so
``slime-gb10 doctor`` works on a machine where the trainer's or the kernels'
optional dependencies are missing, and ``--help`` is instant.
"""

from __future__ import annotations

import importlib
import traceback

import click

from slime_gb10 import __version__
from slime_gb10.utils.errors import VERBOSE, UserError, os_error_message

# name -> "module:attribute" of a click.Command
SUBCOMMANDS: dict[str, str] = {
    "doctor": "slime_gb10.doctor:doctor_command",
    "train": "slime_gb10.grpo.cli:train_command",
    "sft": "slime_gb10.grpo.cli:sft_command",
    "eval": "slime_gb10.grpo.cli:eval_command",
    "compare": "slime_gb10.grpo.cli:compare_command",
    "plot": "slime_gb10.grpo.cli:plot_command",
    "bench": "slime_gb10.bench:bench_group",
    "verify": "slime_gb10.platform.verify:verify_command",
}

HELP = {
    "doctor": "Check this machine's GPU stack and say how to fix what is broken.",
    "train": "GRPO post-training (no arguments: the embedded SmolLM2-135M default run).",
    "sft": "Supervised fine-tuning on reference solutions (GSM8K): a warm start for train.",
    "eval": "pass@1 (greedy, with its 95% interval), format compliance and pass@k on a held-out split.",
    "compare": "Two eval results on the same questions, paired (McNemar's exact test).",
    "plot": "Draw the curves of a training run's metrics.jsonl as PNG.",
    "bench": "Benchmarks that measure the device's ceilings and report ratios.",
    "verify": "Check a GPU machine end to end (GB10 blockers, GPU tests, GRPO steps) into one report.",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (click's documented pattern)."""

    def __init__(self, *args, lazy_subcommands: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import every subcommand (and its heavy dependencies).
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        """The one error handler of every subcommand: a ``UserError`` (or a full disk, a denied
        permission) is one line and exit 1; ``-v`` adds the traceback. Anything else is a bug and
        keeps its traceback."""
        try:
            return super().invoke(ctx)
        except (UserError, OSError) as exc:
            message = str(exc) if isinstance(exc, UserError) else os_error_message(exc)
            if message is None:
                raise
            if ctx.meta.get(VERBOSE):
                traceback.print_exc()
        raise click.ClickException(message) from None

    def _load(self, cmd_name: str) -> click.Command:
        module_name, attr = self.lazy_subcommands[cmd_name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise click.ClickException(
                f"'slime-gb10 {cmd_name}' is not available: {exc}. "
                "Install the missing package (see README: 'Install') or run 'slime-gb10 doctor'."
            ) from exc
        command = getattr(module, attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}:{attr} is not a click command")
        return command


@click.group(
    cls=LazyGroup, lazy_subcommands=SUBCOMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="slime-gb10")
def main() -> None:
    """RL post-training and NVFP4 on NVIDIA DGX Spark (GB10). Start with: slime-gb10 doctor"""


if __name__ == "__main__":  # pragma: no cover
    main()
