"""``slime-gb10 bench ...``: benchmarks, each measuring the device ceilings in the same run."""

from __future__ import annotations

import click

from slime_gb10.cli import LazyGroup

BENCHMARKS = {
    "grpo": "slime_gb10.grpo.bench:bench_grpo_command",
    "nvfp4": "slime_gb10.nvfp4.bench:bench_nvfp4_command",
}


@click.group(cls=LazyGroup, lazy_subcommands=BENCHMARKS)
def bench_group() -> None:
    """Benchmarks: each reports ratios to the device's measured copy bandwidth and GEMM rate."""
