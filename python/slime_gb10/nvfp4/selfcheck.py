"""The doctor's NVFP4 self-checks: TransformerEngine's NVFP4 recipe on this GPU, and our W4A16
kernels against the reference (each in a child process with a time limit)."""

from __future__ import annotations

from slime_gb10.platform.checks import (
    CheckResult,
    DoctorContext,
    installed,
    register_check,
    run_child_module,
)
from slime_gb10.platform.checks_packages import PACKAGES
from slime_gb10.platform.devices import sm_arch

# how to get a TransformerEngine built for this torch / CUDA 13 / sm_12x
_TE_REBUILD = next(p.rebuild for p in PACKAGES if p.check == "transformer_engine")


@register_check("te_nvfp4", gpu=True, before="unified_memory")
def check_te_nvfp4(ctx: DoctorContext) -> CheckResult:
    """TransformerEngine's NVFP4 recipe is available (sm_12x needs NVFP4BlockScaling(disable_rht=True))."""
    if not installed("transformer_engine"):
        return CheckResult.skip(
            "te_nvfp4", "TransformerEngine not installed (optional: pip install 'slime-gb10[te]')"
        )
    if ctx.capability[0] < 10:
        return CheckResult.skip(
            "te_nvfp4", f"NVFP4 tensor cores need Blackwell; this GPU is {sm_arch(ctx.capability)}"
        )
    child = run_child_module("slime_gb10.nvfp4.probe_te_nvfp4", ctx.timeout_s)
    if failed := child.failed("te_nvfp4", "the TE NVFP4 probe", _TE_REBUILD):
        return failed
    data = child.data
    if not data["has_recipe"]:
        return CheckResult.fail(
            "te_nvfp4",
            "this TransformerEngine has no NVFP4BlockScaling recipe",
            "install TransformerEngine >= 2.8",
            **data,
        )
    if not data["available"]:
        return CheckResult.fail(
            "te_nvfp4", f"TE says NVFP4 is unavailable: {data['reason']}", _TE_REBUILD, **data
        )
    if ctx.sm12x:
        return CheckResult.warn(
            "te_nvfp4",
            "NVFP4 available; on sm_12x the Random Hadamard Transform kernel fails for M > 32 (TE issue #2372)",
            "use NVFP4BlockScaling(disable_rht=True) (slime-gb10's NVFP4 recipe does)",
            **data,
        )
    return CheckResult.ok("te_nvfp4", "NVFP4 available", **data)


@register_check("w4a16_kernels", gpu=True, before="unified_memory")
def check_w4a16_kernels(ctx: DoctorContext) -> CheckResult:
    """NVFP4Linear's w4a16 kernels run and are right: the CUDA one (NVRTC, M <= 32) and the two Triton
    ones (the wide kernel takes M > 16 on large weights: on GB10, mma.sync instead of Hopper's wgmma)."""
    if not installed("triton"):
        return CheckResult.skip(
            "w4a16_kernels", "Triton is not installed: w4a16 dequantizes and calls cuBLAS"
        )
    child = run_child_module("slime_gb10.nvfp4.probe_w4a16", ctx.timeout_s)
    fix = "run `slime-gb10 doctor` again with a longer --timeout; check the triton_jit line"
    if failed := child.failed("w4a16_kernels", "the W4A16 probe", fix):
        return failed
    data = child.data
    triton_err, wide_err = data.get("triton"), data.get("wide")
    for name, err in (("Triton W4A16 kernel", triton_err), ("wide Triton W4A16 kernel (M > 16)", wide_err)):
        if not isinstance(err, float) or not err < 1e-2:
            return CheckResult.fail(
                "w4a16_kernels",
                f"the {name} is wrong or fails: {err}",
                "reinstall a triton that matches torch (`pip install --force-reinstall torch triton`)",
                **data,
            )
    if not data["cuda_available"]:
        return CheckResult.warn(
            "w4a16_kernels",
            f"Triton kernels correct (rel. error {triton_err:.1g}, {wide_err:.1g}); the CUDA kernel for M <= 32 is "
            "unavailable "
            "(NVRTC not found, torch without torch.cuda._compile_kernel, or a pre-Hopper GPU): M <= 32 runs "
            "slower, on the Triton kernel",
            "put a CUDA 13 toolkit with lib/libnvrtc.so under CUDA_HOME (the flake's shell does), or "
            "pip install nvidia-cuda-nvrtc",
            **data,
        )
    cuda_err = data.get("cuda")
    if not isinstance(cuda_err, float) or not cuda_err < 1e-2:
        return CheckResult.fail(
            "w4a16_kernels",
            f"the CUDA W4A16 kernel (NVRTC) is wrong or fails: {cuda_err}",
            "SLIME_GB10_W4A16_ENGINE=triton turns it off; report the line above",
            **data,
        )
    return CheckResult.ok(
        "w4a16_kernels",
        f"CUDA (NVRTC, M <= 32), Triton and wide Triton kernels correct (rel. error {cuda_err:.1g}, "
        f"{triton_err:.1g}, {wide_err:.1g})",
        **data,
    )
