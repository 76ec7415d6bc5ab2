"""``python -m slime_gb10.platform.probes.triton_add``: a tiny Triton add kernel JIT-compiles, runs on
GPU 0 and its error against float64 (one JSON line; the doctor's ``triton_jit`` check)."""

import json

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def main() -> None:
    n = 3000
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    out = torch.empty(n, device="cuda")
    add_kernel[(triton.cdiv(n, 1024),)](x.cuda(), y.cuda(), out, n, BLOCK=1024)
    torch.cuda.synchronize()
    err = (out.cpu().double() - (x.double() + y.double())).abs().max().item()
    print(json.dumps({"max_abs_err": err, "triton": triton.__version__}))


if __name__ == "__main__":
    main()
