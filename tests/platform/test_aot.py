"""Compiles for a GB10 without one: Triton for cuda:121 and nvcc from one CUDA_HOME for sm_121a,
read back with cuobjdump (python -m slime_gb10.platform.aot, the flake's cpu-sm121a-compile).

Real tools only: skipped, saying which is missing, where Triton, a ptxas that knows sm_121a, nvcc
or cuobjdump is not installed (CI's machine has a CUDA 13.0 toolkit in /usr/local/cuda)."""

from __future__ import annotations

import pytest

from slime_gb10.platform import aot
from slime_gb10.platform.ptxas import cuda_home, find_working_ptxas, triton_dir


def _cuda_home_with_nvcc():
    home = cuda_home()
    if home is None or not (home / "bin" / "nvcc").is_file():
        pytest.skip(
            "no CUDA toolkit with nvcc here (CUDA_HOME, /usr/local/cuda): the nvcc compile is not checked"
        )
    return home


def _cuobjdump(home=None):
    found = aot.find_cuobjdump(home)
    if found is None:
        pytest.skip("no cuobjdump here (CUDA toolkit or Triton's bundled one)")
    return found


def test_triton_compiles_for_sm_121a_without_a_gpu(monkeypatch, tmp_path):
    if triton_dir() is None:
        pytest.skip("Triton is not installed")
    ptxas = find_working_ptxas("sm_121a")
    if ptxas is None:
        pytest.skip("no ptxas here assembles sm_121a (CUDA >= 12.9 needed)")
    # what the flake's environment sets (nix/gb10.nix runtimeEnv): Triton >= 3.5 reads the Blackwell one
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(ptxas.path))
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(ptxas.path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    cubin = aot.triton_cubin(121)
    assert aot.cubin_sm(cubin, _cuobjdump()) == "121a"


def test_nvcc_compiles_for_sm_121a_from_cuda_home():
    home = _cuda_home_with_nvcc()
    cubin = aot.cuda_cubin(home, "sm_121a", aot.RUNTIME_SOURCE)
    assert aot.cubin_sm(cubin, _cuobjdump(home)) == "121a"


def test_nvcc_compiles_the_run_time_compilers_headers_for_sm_121a():
    """cuBLAS and cuRAND headers too (FlashInfer's JIT needs them): the flake's CUDA_HOME has them."""
    home = _cuda_home_with_nvcc()
    missing = [h for h in ("cublas_v2.h", "curand_kernel.h") if not (home / "include" / h).is_file()]
    if missing:
        pytest.skip(f"the CUDA toolkit at {home} has no {', '.join(missing)} (a partial toolkit); "
                    "the flake's cpu-sm121a-compile compiles these against its CUDA_HOME")  # fmt: skip
    cubin = aot.cuda_cubin(home, "sm_121a")
    assert aot.cubin_sm(cubin, _cuobjdump(home)) == "121a"


def test_a_missing_header_is_an_error_naming_it():
    """A CUDA_HOME without cuBLAS's headers (a bare toolkit, or a symlinkJoin missing a component)."""
    home = _cuda_home_with_nvcc()
    if (home / "include" / "cublas_v2.h").is_file():
        pytest.skip(f"the CUDA toolkit at {home} has cuBLAS's headers: nothing is missing to report")
    with pytest.raises(
        aot.AotError, match=r"could not compile headers_sm121a\.cu for sm_121a: .*cublas_v2\.h"
    ):
        aot.cuda_cubin(home, "sm_121a")


def test_the_command_reports_each_compile(capsys, monkeypatch, tmp_path):
    home = _cuda_home_with_nvcc()
    ptxas = find_working_ptxas("sm_121a") if triton_dir() is not None else None
    if ptxas is None:
        pytest.skip("Triton with a ptxas that knows sm_121a is needed for the whole command")
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(ptxas.path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    rc = aot.main(["triton", "--cuda-home", str(home), "--arch", "121"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "ok    triton: Triton for cuda:121 -> cubin for sm_121a" in out
    if not (home / "include" / "curand_kernel.h").is_file():  # a partial toolkit: the full compile fails
        assert aot.main(["cuda", "--cuda-home", str(home)]) == 1
        assert "fail  cuda: nvcc" in capsys.readouterr().out
