"""``python -m slime_gb10.platform.probes.torch_device INDEX``: torch, its CUDA build and device INDEX,
as one JSON line (run by :func:`slime_gb10.platform.probe.run_probe`)."""

import json
import sys
import warnings


def main() -> None:
    index = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    out = {"torch_importable": False}
    try:
        import torch
    except BaseException as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out))
        return
    out["torch_importable"] = True
    out["torch_version"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_hip"] = getattr(torch.version, "hip", None)
    try:
        out["cudnn_version"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn_version"] = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["cuda_available"] = bool(torch.cuda.is_available())
        except Exception as exc:
            out["cuda_available"] = False
            out["cuda_error"] = f"{type(exc).__name__}: {exc}"
    out["cuda_warnings"] = [str(w.message).strip().splitlines()[0] for w in caught]
    if out["cuda_available"]:
        out["device_count"] = torch.cuda.device_count()
        if index >= out["device_count"]:
            out["cuda_error"] = f"device index {index} out of range ({out['device_count']} devices)"
            out["cuda_available"] = False
        else:
            p = torch.cuda.get_device_properties(index)
            out["device"] = {
                "index": index,
                "name": p.name,
                "capability": [p.major, p.minor],
                "sm_count": p.multi_processor_count,
                "total_memory": p.total_memory,
                "is_integrated": bool(getattr(p, "is_integrated", False)),
            }
            out["arch_list"] = torch.cuda.get_arch_list()
            out["driver_api_version"] = None
            try:  # the CUDA version the driver supports, from the driver API itself
                import ctypes

                version = ctypes.c_int()
                if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
                    out["driver_api_version"] = int(version.value)
            except Exception:
                pass
    print(json.dumps(out))


if __name__ == "__main__":
    main()
