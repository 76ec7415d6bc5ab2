"""The decode loop's bookkeeping kernel (``engines/torch/step_kernel.py``) against its torch twin, step by
step over a whole run of random draws: rows finishing on either of two end tokens at different
steps, finished rows padded, the next step's token, slot, mask and positions written, the slot and
the position bump changing every step. Everything is integer, so the two must agree exactly.

On the CPU the kernel runs under ``TRITON_INTERPRET=1`` (a subprocess: Triton reads it when kernels
are defined); the GPU test runs it compiled.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")

CASES = textwrap.dedent(
    """
    import json
    import torch
    from slime_gb10.grpo.engines.torch import step_kernel

    def compare(device, rows=13, steps=9, eos=(3, 7), pad=1, width=5):
        gen = torch.Generator().manual_seed(rows)
        states = []
        for fused in (False, True):
            on = lambda t: t.clone().to(device) if fused else t.clone()
            finished = on(torch.zeros(rows, dtype=torch.bool))
            input_ids = on(torch.full((rows, 1), -5, dtype=torch.long))
            positions = on(torch.arange(rows)[:, None] + 40)
            cache_position = on(torch.zeros(1, dtype=torch.long))
            mask = on(torch.zeros((rows, 1, 1, width + steps + 1), dtype=torch.bool))
            ends = on(torch.tensor(eos))
            feed = step_kernel.record_and_feed if fused else step_kernel.record_and_feed_reference
            gen.manual_seed(rows)
            trace = []
            for step in range(steps):
                token = on(torch.randint(0, 10, (rows,), generator=gen))  # ~1 row in 5 draws an end
                recorded = feed(token, finished, ends, pad, input_ids, positions, cache_position, mask,
                                width + step, int(step > 0))
                trace.append([t.cpu().tolist() for t in (recorded, finished, input_ids, positions,
                                                         cache_position, mask)])
            states.append(trace)
        plain, kernel = states
        return {"same": plain == kernel, "finished_rows": sum(plain[-1][1]), "rows": rows,
                "padded": sum(t == pad for t in plain[-1][0])}
    """
)


def _check(report: dict) -> None:
    assert report["same"], report
    # the random draws exercised both kinds of row: some finished (and were padded), some not
    assert 0 < report["finished_rows"] < report["rows"] and report["padded"] > 0, report


def test_the_step_kernel_is_its_twin_under_the_interpreter(triton_interpreter):
    _check(triton_interpreter(CASES + "\nprint(json.dumps(compare('cpu')))\n"))


@pytest.mark.gpu
def test_the_step_kernel_is_its_twin_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none here); runs on the device / in the flake's GPU checks")
    namespace: dict = {}
    exec(CASES, namespace)
    _check(namespace["compare"]("cuda"))
    _check(namespace["compare"]("cuda", rows=160, steps=30, eos=(2,), pad=2))
