"""The device's ceilings, measured in the same run as every benchmark (``slime-gb10 bench ...``):
copy bandwidth, BF16 GEMM rate, the time to read a buffer once, and the CUDA-graph harness that
times calls without CPU launch overhead (METHOD.md: rotate input sets that fit in cache)."""

from __future__ import annotations

import functools
from importlib.resources import files

import torch


def median_ms(fn, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn`` (CUDA events, L2 flushed between calls)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def measure_copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, GB/s counting bytes read + bytes written."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), rep_ms=300)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure_bf16_gemm(n: int = 8192) -> float:
    """``torch.matmul`` of two random n x n BF16 matrices, TFLOP/s."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: torch.matmul(a, b), rep_ms=300)
    return 2 * n**3 / (ms * 1e-3) / 1e12


#: A kernel that only reads: two buffers in 16-byte loads, four in flight per thread, grid-stride.
#: Its time over a weight's bytes, in the same CUDA-graph harness as the GEMMs, is the floor of any
#: kernel that streams those bytes once: launch, DRAM latency and bandwidth, no compute.
READ_KERNEL = (files("slime_gb10.nvfp4") / "cuda" / "stream_read.cu").read_text(encoding="utf-8")


@functools.cache
def _read_kernel(device_index: int):
    from slime_gb10.nvfp4 import _cuda_w4a16

    return _cuda_w4a16.compile_kernel(device_index, READ_KERNEL, "stream_read")


def measure_read_floor(buffers: list[tuple[torch.Tensor, ...]], reps: int) -> float | None:
    """Milliseconds per call to read each entry of ``buffers`` (one or two tensors: a weight copy)
    once, cycling through them as the GEMM timings do; the best of three launch shapes. None where
    NVRTC is not available or a buffer is not a whole number of 16-byte words."""
    from slime_gb10.nvfp4 import _cuda_w4a16

    flat = [[t.reshape(-1).view(torch.uint8) for t in entry] for entry in buffers]
    if not _cuda_w4a16.available() or any(t.numel() % 16 or t.data_ptr() % 16 for e in flat for t in e):
        return None
    kernel = _read_kernel(torch.cuda.current_device())  # compiled once, not per layer
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    pairs = [(e[0], e[1] if len(e) > 1 else sink.view(torch.uint8)[:0]) for e in flat]

    def call(a, b, grid, threads):
        return lambda: kernel(
            grid=(grid, 1, 1), block=(threads, 1, 1), args=[a, a.numel() // 16, b, b.numel() // 16, sink]
        )

    return min(
        graph_time([call(a, b, grid, threads) for a, b in pairs], reps, replays=5)
        for grid, threads in ((4 * sms, 512), (8 * sms, 512), (8 * sms, 128))
    )


def graph_time(calls, reps: int, replays: int = 7) -> float:
    """Median milliseconds per call of ``reps`` calls (cycling through ``calls``) captured in one CUDA
    graph: no CPU launch overhead, and with enough distinct buffers in the cycle that weights stream
    from memory rather than from the 50 MB L2 (METHOD.md: rotate input sets that fit in cache)."""
    return graph_times([calls], reps, replays)[0]


def graph_times(call_lists, reps: int, replays: int = 7) -> list[float]:
    """:func:`graph_time` of several call lists, their graphs replayed in turn (A B C A B C ...), so
    that the clock and power state drifting over a run (a heavy GEMM lowers the clocks for whatever
    follows it) weighs on each of them alike. With several lists each timed replay follows an untimed
    one of the same graph: straight after another graph, the caches hold that graph's data (timed so,
    calls at M = 1-8 after a dequantize + cuBLAS graph were 4-12% slower)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for calls in call_lists:  # compile / warm up outside the capture
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graphs = []
    for calls in call_lists:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for r in range(reps):
                calls[r % len(calls)]()
        graph.replay()
        graphs.append(graph)
    torch.cuda.synchronize()
    times = [[] for _ in graphs]
    for _ in range(replays):
        for graph, kept in zip(graphs, times):
            if len(graphs) > 1:
                graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            kept.append(start.elapsed_time(end) / reps)
    del graphs
    return [sorted(kept)[len(kept) // 2] for kept in times]
