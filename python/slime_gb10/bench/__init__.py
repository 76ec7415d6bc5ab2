"""``slime-gb10 bench ...``: the one home of the benchmarks (``decode``, ``grpo``, ``nvfp4``), each measuring the
device ceilings (:mod:`~slime_gb10.bench.ceilings`) in the same run. Above the code they measure:
nothing in ``grpo``, ``nvfp4`` or ``platform`` imports them."""

from __future__ import annotations

import click

from slime_gb10.cli import LazyGroup

BENCHMARKS = {
    "decode": "slime_gb10.bench.decode:bench_decode_command",
    "grpo": "slime_gb10.bench.grpo:bench_grpo_command",
    "nvfp4": "slime_gb10.bench.nvfp4:bench_nvfp4_command",
}


@click.group(cls=LazyGroup, lazy_subcommands=BENCHMARKS)
def bench_group() -> None:
    """Benchmarks: each reports ratios to the device's measured copy bandwidth and GEMM rate."""
