"""The benchmark command's plumbing on the CPU (the numbers themselves need a GPU: BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from slime_gb10.bench.nvfp4 import bench_nvfp4_command, format_table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_bench_without_cuda_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(bench_nvfp4_command, ["--json", str(tmp_path / "out.json")])
    assert result.exit_code != 0
    assert "needs a CUDA GPU" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out.json").exists()


def test_bench_rejects_an_unwritable_json_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(bench_nvfp4_command, ["--json", str(blocker / "sub" / "out.json")])
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_format_table_lists_every_row():
    result = {
        "device": "GPU",
        "capability": [9, 0],
        "date": "2026-11-21",
        "torch": "2",
        "triton": "3",
        "copy_bandwidth_GBps": 3000.0,
        "bf16_gemm_TFLOPS": 700.0,
        "quantize": [
            {
                "shape": [8192, 16384],
                "MiB_bf16": 256.0,
                "GBps_given_scale": 2500.0,
                "pct_copy_given_scale": 83.3,
                "pct_copy_given_scale_divide_variant": 60.0,
                "GBps_with_amax_stated_bytes": 1500.0,
                "pct_copy_with_amax_stated_bytes": 50.0,
                "pct_copy_dequantize": 80.0,
                "speedup_vs_torch": 20.0,
                "bit_identical_to_reference": True,
                "relative_error": 0.1,
            }
        ],
        "w4a16": [
            {
                "M": m,
                "N": 4096,
                "K": 4096,
                "ms_bf16_matmul": 0.012,
                "bf16_pct_of_floor": 80.0,
                "ms_dequant_cublas": 0.02,
                "ms_auto": 0.005,
                "speedup_auto_vs_bf16": 2.4,
                **(
                    {"ms_fused": 0.005, "fused_pct_of_floor": 60.0, "speedup_fused_vs_bf16": 2.4}
                    if m == 1
                    else {}
                ),
                **(
                    {
                        "ms_read_w4": 0.004,
                        "ms_read_bf16": 0.011,
                        "bf16_vs_read_w4": 3.0,
                        "auto_vs_read_w4": 1.25,
                    }
                    if m == 1
                    else {}
                ),
            }
            for m in (1, 4096)
        ],
    }
    table = format_table(result)
    assert "3000 GB/s" in table and "83.3" in table
    assert table.count("4096  4096 |") == 2
    assert "3.00x      1.25" in table  # the read floor's columns where measured
    assert table.count("|            --") == 1  # and a dash where not


def test_read_floor_needs_nvrtc_and_whole_words():
    """No GPU (or NVRTC) here: no floor rather than an error; the bench rows then omit its columns."""
    from slime_gb10.bench.nvfp4 import measure_read_floor

    assert measure_read_floor([(torch.zeros(64, dtype=torch.uint8),)], reps=2) is None


@pytest.mark.gpu
def test_graph_times_replays_the_graphs_in_turn():
    """Each call list runs once as warm-up, once after its capture, then per round one untimed and
    one timed replay when several lists are timed together (one replay a round when alone). The
    calls count themselves on the device, so the replays are counted, not timed."""
    from slime_gb10.bench.nvfp4 import graph_time, graph_times

    counts = torch.zeros(3, dtype=torch.int64, device="cuda")
    first = [lambda: counts[0].add_(1)]
    second = [lambda: counts[1].add_(1), lambda: counts[1].add_(10)]  # reps cycle through both
    times = graph_times([first, second], reps=4, replays=3)
    torch.cuda.synchronize()
    replays = 1 + 3 * 2
    assert counts[0].item() == 1 + replays * 4
    assert counts[1].item() == 11 + replays * 22
    assert len(times) == 2 and all(t > 0 for t in times)

    alone = graph_time([lambda: counts[2].add_(1)], reps=5, replays=3)
    torch.cuda.synchronize()
    assert counts[2].item() == 1 + (1 + 3) * 5 and alone > 0
