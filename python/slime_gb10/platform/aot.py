"""Ahead-of-time compiles for a GPU that is not here: the toolchain checks no GPU is needed for.

Two things decide whether code compiled at run time works on a GB10, and both can be checked on
any machine, without a GPU:

* **Triton** compiles a kernel for ``cuda:121`` with the ptxas the environment points it at
  (Triton >= 3.5 reads ``TRITON_PTXAS_BLACKWELL_PATH`` for sm_100+): :func:`triton_cubin`.
* **nvcc from one CUDA_HOME** compiles a source that includes what run-time compilers need
  (CCCL, the runtime, cuBLAS, cuRAND, FP16/BF16 headers; FlashInfer's JIT is the demanding one):
  :func:`cuda_cubin` on ``aot_src/headers_sm121a.cu``.

Each result is a cubin whose target is read back with ``cuobjdump -elf`` (``sm=121a``). The flake's
CPU check runs ``python -m slime_gb10.platform.aot`` in the build sandbox; ``tests/platform/test_aot.py``
runs the same where the tools exist.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from slime_gb10.platform import binaries, subproc
from slime_gb10.utils.errors import UserError, first_line

CUDA_SOURCE = "headers_sm121a.cu"  # runtime, CCCL, cuBLAS, cuRAND, FP16/BF16: a complete CUDA_HOME
RUNTIME_SOURCE = "runtime_sm121a.cu"  # runtime, CCCL, BF16: what a bare toolkit has


class AotError(UserError, RuntimeError):
    """A compile or the check of its result failed; the message says which and why."""


def _axpy_kernel():
    """A Triton kernel defined at call time: importing this module must not need Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, n, a, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, a * x + y, mask=mask)

    return axpy


def triton_cubin(arch: int = 121) -> bytes:
    """Compile a small Triton kernel for ``cuda:<arch>`` (no GPU needed); the cubin's bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {
        "x_ptr": "*fp32",
        "y_ptr": "*fp32",
        "out_ptr": "*fp32",
        "n": "i32",
        "a": "fp32",
        "BLOCK": "constexpr",
    }
    source = ASTSource(fn=_axpy_kernel(), signature=signature, constexprs={"BLOCK": 1024})
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    except Exception as exc:  # PTXASError, a missing ptxas, an MLIR failure...
        first = first_line(exc)
        raise AotError(f"Triton could not compile for cuda:{arch}: {type(exc).__name__}: {first}") from exc
    return kernel.asm["cubin"]


def cuda_cubin(cuda_home: str | os.PathLike, arch: str = "sm_121a", source: str = CUDA_SOURCE) -> bytes:
    """Compile ``aot_src/<source>`` with ``CUDA_HOME/bin/nvcc`` for ``arch``; the cubin's bytes."""
    home = Path(cuda_home)
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        raise AotError(f"no nvcc in CUDA_HOME '{home}' ({nvcc} is missing)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / source
        src.write_bytes(resources.files("slime_gb10.platform").joinpath("aot_src", source).read_bytes())
        out = Path(tmp) / "out.cubin"
        cmd = [str(nvcc), f"-arch={arch}", "-cubin", "-I", str(home / "include"), "-o", str(out), str(src)]
        done = subproc.run(cmd, 300)
        if done.returncode != 0 or not out.is_file():
            lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
            shown = next((x for x in lines if "error" in x.lower()), lines[-1] if lines else "no output")
            raise AotError(f"nvcc ({nvcc}) could not compile {source} for {arch}: {shown.strip()[:300]}")
        return out.read_bytes()


def cubin_sm(cubin: bytes, cuobjdump: str | os.PathLike) -> str:
    """The target of a cubin as ``cuobjdump -elf`` reports it (``121a``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        done = subproc.run([str(cuobjdump), "-elf", fh.name], 60)
    match = re.search(r"\bsm=(\d+[af]?)\b", done.stdout)
    if done.returncode != 0 or match is None:
        raise AotError(
            f"cuobjdump -elf could not read the cubin: {(done.stderr or done.stdout).strip()[:300]}"
        )
    return match.group(1)


def find_cuobjdump(cuda_home: str | os.PathLike | None = None) -> str | None:
    """``<cuda_home>/bin/cuobjdump`` when given, else the doctor's search (PATH, CUDA_HOME, Triton's copy)."""
    if cuda_home is not None and (Path(cuda_home) / "bin" / "cuobjdump").is_file():
        return str(Path(cuda_home) / "bin" / "cuobjdump")
    return binaries.find_cuobjdump()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slime_gb10.platform.aot", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("what", nargs="*", choices=["triton", "cuda"], default=["triton", "cuda"])
    parser.add_argument("--cuda-home", default=os.environ.get("CUDA_HOME"), help="default: $CUDA_HOME")
    parser.add_argument("--arch", type=int, default=121, help="compute capability x 10 (default 121: GB10)")
    args = parser.parse_args(argv)
    cuobjdump = find_cuobjdump(args.cuda_home)
    if cuobjdump is None:
        print("fail: no cuobjdump (in $CUDA_HOME/bin or on PATH) to read the cubins back", file=sys.stderr)
        return 1
    want = f"{args.arch}a"
    failed = False
    for what in args.what:
        try:
            if what == "triton":
                cubin, how = triton_cubin(args.arch), f"Triton for cuda:{args.arch}"
            else:
                if not args.cuda_home:
                    raise AotError("no CUDA_HOME: pass --cuda-home")
                cubin, how = cuda_cubin(args.cuda_home, f"sm_{want}"), f"nvcc from {args.cuda_home}"
            got = cubin_sm(cubin, cuobjdump)
        except AotError as exc:
            print(f"fail  {what}: {exc}")
            failed = True
            continue
        ok = got == want
        failed |= not ok
        print(f"{'ok  ' if ok else 'fail'}  {what}: {how} -> cubin for sm_{got} ({len(cubin)} bytes)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
