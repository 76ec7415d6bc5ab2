"""``python -m slime_gb10.nvfp4.probe_w4a16``: NVFP4Linear's w4a16 kernels (CUDA, Triton, wide) on
GPU 0 against a float64 reference, relative error per engine or its error (one JSON line; the doctor's
``w4a16_kernels`` check)."""

import json

import torch


def main() -> None:
    from slime_gb10.nvfp4 import _cuda_w4a16, dequantize_reference, quantize_reference, w4a16

    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 512, generator=g) * 0.05
    x = torch.randn(48, 512, generator=g).bfloat16()
    q = quantize_reference(w)
    ref = x.double() @ dequantize_reference(q, torch.float64).T
    p = w4a16.prepare_w4a16(q.to("cuda"))
    res = {"cuda_available": _cuda_w4a16.available()}
    for engine in ("cuda", "triton", "wide") if res["cuda_available"] else ("triton", "wide"):
        try:  # one token and 24 (the CUDA kernel's tilings for M <= 8 and M = 17..32); the wide kernel at 24 and 48
            errs = []
            for m in (24, 48) if engine == "wide" else (1, 24):
                out = w4a16.w4a16_matmul(x[:m].cuda(), p, engine=engine).cpu().double()
                errs.append(float((out - ref[:m]).norm() / ref[:m].norm()))
            res[engine] = max(errs)
        except Exception as exc:
            res[engine] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(json.dumps(res))


if __name__ == "__main__":
    main()
