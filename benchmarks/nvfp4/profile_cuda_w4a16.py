"""Run the CUDA W4A16 kernel (one tiling) and BF16 cuBLAS a few times each, for ``ncu``.
Development tool: the benchmark of record is ``slime-gb10 bench nvfp4``.

    ncu --section SpeedOfLight --section WarpStateStats ... python3 benchmarks/nvfp4/profile_cuda_w4a16.py \
        M N K nt cluster rw depth rows loads
"""

import sys

import torch

from slime_gb10.nvfp4 import _cuda_w4a16 as cuda
from slime_gb10.nvfp4 import bench, kernels
from slime_gb10.nvfp4.format import NVFP4Tensor, quantize

M, N, K, *tiling = (int(v) for v in sys.argv[1:])
plan = cuda.Plan(*tiling)
w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") * 0.02
q = quantize(w)
copies = bench._copies(q.nbytes)
ps = [
    kernels.prepare_w4a16(
        NVFP4Tensor(q.data.clone(), q.scale.clone(), q.global_scale.clone(), q.shape, q.dtype)
    )
    for _ in range(copies)
]
ws = [w.clone() for _ in range(bench._copies(w.numel() * 2))]
x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
for i in range(4):
    p = ps[i % copies]
    cuda.w4a16_small(x, p.data, p.scale_codes, p.global_scale, None, out, plan)
    torch.matmul(x, ws[i % len(ws)].T)
torch.cuda.synchronize()
