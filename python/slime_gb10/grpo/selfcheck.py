"""The doctor's GRPO self-check: which rollout engine / policy backend pair ``auto`` picks here."""

from __future__ import annotations

from slime_gb10.platform.checks import (
    CheckResult,
    DoctorContext,
    register_check,
    run_child_module,
)


def grpo_backend_pair(sglang_ok: bool, megatron_ok: bool) -> str:
    """The rollout+trainer pair ``slime-gb10 train`` resolves ``auto`` to (the trainer's own rule)."""
    from slime_gb10.grpo.registry import auto_pair

    return "+".join(auto_pair(sglang_ok, megatron_ok))


@register_check("grpo_backends", before="distributed")
def check_grpo_backends(ctx: DoctorContext) -> CheckResult:
    """Which rollout engine + policy backend pair this machine can run (SGLang / Megatron-core, else PyTorch)."""
    if not ctx.gpu:
        return CheckResult.ok(
            "grpo_backends", f"auto = torch+torch (the portable PyTorch path; {ctx.no_gpu_reason()})"
        )
    child = run_child_module("slime_gb10.grpo.probe_backends", ctx.timeout_s)
    fix = "run: python -c 'import slime_gb10.grpo.engines.sglang_engine' to see the error"
    then = "; training falls back to torch+torch"
    if failed := child.failed(
        "grpo_backends", "probing the SGLang / Megatron backends", fix, warn=True, then=then
    ):
        return failed
    (sglang_ok, sglang_why), (megatron_ok, megatron_why) = child.data["sglang"], child.data["megatron"]
    pair = grpo_backend_pair(sglang_ok, megatron_ok)
    reason = f"auto = {pair} (sglang: {sglang_why}; megatron: {megatron_why})"
    details = {"pair": pair, "sglang": child.data["sglang"], "megatron": child.data["megatron"]}
    return CheckResult.ok_unless(
        "grpo_backends",
        reason,
        "GB10 runs best on sglang+megatron" if ctx.gb10 and pair != "sglang+megatron" else None,
        "enter the flake's environment (`nix develop`), which builds both for sm_121a, "
        "or pip install 'slime-gb10[sglang,megatron,te]'",
        **details,
    )
