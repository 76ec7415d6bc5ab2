"""``python -m slime_gb10.platform.probes.cublas_bf16``: a cuBLAS BF16 GEMM on GPU 0 against float64
(relative Frobenius error, one JSON line; the doctor's ``cublas_bf16`` check)."""

import json

import torch


def main() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(256, 512, generator=g).bfloat16()
    b = torch.randn(512, 384, generator=g).bfloat16()
    c = (a.cuda() @ b.cuda()).double().cpu()
    ref = a.double() @ b.double()
    rel = ((c - ref).norm() / ref.norm()).item()
    print(json.dumps({"rel_err": rel, "shape": [256, 512, 384]}))


if __name__ == "__main__":
    main()
