"""The Triton kernels compile to machine code for Hopper (sm_90) and GB10 (sm_121a) with the ptxas that
ships in the Triton wheel, on this CPU-only machine: inline PTX, layouts and register limits are checked
here rather than first on a GPU. (Running them is test_kernels_gpu.py's job.)"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from slime_gb10.nvfp4 import _triton_kernels as k  # noqa: E402

W4A16_SIGNATURE = {
    "x_ptr": "*bf16",
    "w_ptr": "*u8",
    "s_ptr": "*u8",
    "gs_ptr": "*fp32",
    "out_ptr": "*bf16",
    "bias_ptr": "*bf16",
    "partial_ptr": "*fp32",
    "counter_ptr": "*i32",
    "M": "i32",
    "N": "i32:16",  # divisible by 16: what the launcher's JIT specializes for 4096-wide layers
    "K": "i32:16",
    "MN": "i32",
    "stride_xm": "i32:16",
    "tiles_per_split": "i32",
}


def compile_for(fn, signature: dict, constexprs: dict, arch: int, **options):
    names = list(fn.arg_names)
    sig = {n: t.removesuffix(":16") for n, t in signature.items()} | {n: "constexpr" for n in constexprs}
    aligned = {  # what Triton's JIT assumes of 16-byte aligned pointers and multiples of 16
        (names.index(n),): [["tt.divisibility", 16]]
        for n, t in signature.items()
        if t.startswith("*") or t.endswith(":16")
    }
    src = ASTSource(
        fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in constexprs.items()}, attrs=aligned
    )
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, **options})


def sass(compiled) -> str:
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if not os.path.exists(nvdisasm):
        pytest.skip("nvdisasm is not bundled with this Triton")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"slime_gb10_w4a16_{os.getpid()}.cubin")
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    try:
        return subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 121])
@pytest.mark.parametrize(
    ("use_asm", "even", "maxnreg"),
    [(True, True, None), (True, True, 128), (True, False, None), (False, True, None)],
)
def test_w4a16_kernel_compiles(arch, use_asm, even, maxnreg):
    constexprs = dict(
        BM=16, BN=128, BK=128, SPLIT=4, USE_ASM=use_asm, HAS_BIAS=True, INTERPRET=False, EVEN=even
    )
    cap = {"maxnreg": maxnreg} if maxnreg else {}  # the launcher's cap for 128-wide small-M tiles
    compiled = compile_for(k.w4a16_kernel, W4A16_SIGNATURE, constexprs, arch, num_stages=1, **cap)
    assert compiled.asm["cubin"]
    ptx = compiled.asm["ptx"]
    assert ("mul.rn.bf16x2" in ptx) == use_asm  # the inline decoder is in, or not
    assert "mma.sync" in ptx  # BF16 tensor-core MMA (no FP4 MMA on Hopper)
    if arch == 90:
        code = sass(compiled)
        assert "HMMA" in code and ("HMUL2" in code) == use_asm
        if (
            not maxnreg
        ):  # under the cap a few spills are expected, and measured to pay off (docs/nvfp4-notes.md)
            assert "LDL" not in code and "STL" not in code  # no local memory


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 121])
@pytest.mark.parametrize(
    ("BN", "BM", "BK", "split"), [(64, 32, 256, 4), (64, 128, 128, 4), (128, 64, 128, 1)]
)
def test_wide_w4a16_kernel_keeps_the_decoded_weights_in_registers(arch, BN, BM, BK, split):
    """On sm_90 the decoded weights are ``wgmma``'s A operand straight from registers (the point of
    the kernel: no shared-memory round trip for them; the activations are the shared-memory B
    operand); sm_121 (GB10) has no ``wgmma`` and takes ``mma.sync``. No local memory either way."""
    signature = {**W4A16_SIGNATURE, "MN": "i32:16", "k_per_split": "i32:16"}
    del signature["tiles_per_split"]
    constexprs = dict(BN=BN, BM=BM, BK=BK, GROUP=8, SPLIT=split, HAS_BIAS=True, INTERPRET=False)
    compiled = compile_for(k.w4a16_wide_kernel, signature, constexprs, arch, num_stages=3)
    ttgir = compiled.asm["ttgir"]
    if arch == 90:
        dots = [line for line in ttgir.splitlines() if "ttng.warp_group_dot " in line]
        # A: a register tensor of BN weight rows; B: the activations, a shared-memory tile of BM tokens
        a_is_weights = [re.search(rf": tensor<{BN}x\d+xbf16, #ttg.dot_op<{{opIdx = 0", d) for d in dots]
        b_is_tokens = [re.search(rf"\* !ttg.memdesc<\d+x{BM}xbf16", d) for d in dots]
        assert dots and all(a_is_weights) and all(b_is_tokens), dots[:1]
        code = sass(compiled)
        assert "HGMMA" in code
        assert "LDL" not in code and "STL" not in code
    else:
        assert "mma.sync" in compiled.asm["ptx"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 121])
@pytest.mark.parametrize("divide", [False, True])
def test_quantize_kernel_compiles_without_local_memory(arch, divide):
    signature = {
        "x_ptr": "*bf16",
        "words_ptr": "*i32",
        "scale_ptr": "*u8",
        "gs_ptr": "*fp32",
        "n_blocks": "i32",
    }
    compiled = compile_for(k.quantize_kernel, signature, dict(BLOCKS=128, DIVIDE=divide), arch)
    assert compiled.asm["cubin"]
    if arch == 90:
        code = sass(compiled)
        assert "LDG.E.128" in code  # 16-byte loads: each thread reads its block as two vectors
        assert "LDL" not in code and "STL" not in code
