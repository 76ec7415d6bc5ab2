"""Which ``ptxas`` Triton will use, and whether it can assemble for a GPU arch (by running it).

Blocker #1 of the GB10 port: a ptxas that predates ``sm_121a`` makes every Triton kernel fail with
``ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'``. Reading version numbers is
not enough (bundled builds differ), so we assemble a one-instruction PTX module for the target and
look at the result. Every run has a time limit: a broken ptxas gives a verdict, never a hang.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slime_gb10.platform import subproc

# The oldest PTX ISA version that knows each target (PTX ISA release notes; checked with ptxas 12.9
# and 13.4: one version lower gives "PTX .version X does not support .target Y").
_MIN_PTX_VERSION = {
    "sm_80": "7.0",
    "sm_86": "7.1",
    "sm_87": "7.4",
    "sm_89": "7.8",
    "sm_90": "7.8",
    "sm_90a": "8.0",
    "sm_100": "8.6",
    "sm_100a": "8.6",
    "sm_100f": "8.8",
    "sm_103": "8.8",
    "sm_103a": "8.8",
    "sm_103f": "8.8",
    "sm_110": "9.0",
    "sm_110a": "9.0",
    "sm_110f": "9.0",
    "sm_120": "8.7",
    "sm_120a": "8.7",
    "sm_120f": "8.8",
    "sm_121": "8.8",
    "sm_121a": "8.8",
    "sm_121f": "8.8",
}
_SHELL_SIGNAL_CODES = {128 + sig for sig in (4, 6, 7, 8, 9, 11)}
_DEFAULT_PTX_VERSION = "9.0"  # CUDA 13.0's ISA, for targets newer than this table

Verdict = Literal["accepts", "rejects", "missing", "timeout", "crashed", "garbage", "failed"]

FIX_POINT_TRITON = (
    "install a CUDA 13 toolkit (its ptxas knows sm_121a; e.g. `pip install nvidia-cuda-nvcc` or "
    "/usr/local/cuda-13.x) and run through `slime-gb10` / `slime_gb10.platform.apply_runtime_fixes()`, "
    "which points Triton at it, or `export {var}=/usr/local/cuda/bin/ptxas`"
)


def minimal_ptx(gpu_name: str) -> str:
    """A valid one-kernel PTX module for ``gpu_name`` (the smallest thing ptxas must assemble)."""
    version = _MIN_PTX_VERSION.get(gpu_name, _DEFAULT_PTX_VERSION)
    return f".version {version}\n.target {gpu_name}\n.address_size 64\n\n.visible .entry slime_gb10_probe()\n{{\n\tret;\n}}\n"


@dataclass(frozen=True)
class PtxasProbe:
    path: str | None
    gpu_name: str
    verdict: Verdict
    version: str | None  # "13.0" from `ptxas --version`
    message: str  # one line: what happened

    @property
    def ok(self) -> bool:
        return self.verdict == "accepts"


def _first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "fatal" in line or "error" in line:
            return line[:300]
    return (lines[0] if lines else "(no output)")[:300]


def _run(cmd: list[str], timeout_s: float, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subproc.run(cmd, timeout_s, cwd=cwd)


def probe_ptxas(path: str | os.PathLike | None, gpu_name: str, timeout_s: float = 20.0) -> PtxasProbe:
    """Run ``path`` as ptxas on a minimal PTX module for ``gpu_name`` (e.g. ``sm_121a``) and judge it.

    Verdicts: ``accepts`` (wrote an ELF cubin), ``rejects`` (ptxas says the arch or its PTX version is
    unknown), ``missing``, ``timeout`` (ran past ``timeout_s``), ``crashed`` (killed by a signal, or
    the shell's 128+N), ``garbage`` (does not answer ``--version`` like a ptxas), ``failed`` (other).
    """
    if path is None:
        return PtxasProbe(None, gpu_name, "missing", None, "no ptxas found")
    path = str(path)
    if not os.path.isfile(path):
        return PtxasProbe(path, gpu_name, "missing", None, f"{path} does not exist")
    if not os.access(path, os.X_OK):
        return PtxasProbe(path, gpu_name, "missing", None, f"{path} is not executable")

    def crashed(proc: subprocess.CompletedProcess, what: str) -> PtxasProbe | None:
        # A signal (negative code), or a shell wrapper's 128+N for SIGILL/ABRT/BUS/FPE/KILL/SEGV.
        # (ptxas itself exits 255 on ordinary errors.)
        if proc.returncode < 0 or proc.returncode in _SHELL_SIGNAL_CODES:
            signal_no = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
            return PtxasProbe(
                path, gpu_name, "crashed", None, f"`{what}` was killed by signal {signal_no} (crash)"
            )
        return None

    try:
        proc = _run([path, "--version"], timeout_s)
    except subprocess.TimeoutExpired:
        return PtxasProbe(path, gpu_name, "timeout", None, f"`ptxas --version` ran past {timeout_s:g} s")
    except OSError as exc:
        return PtxasProbe(path, gpu_name, "failed", None, f"cannot run {path}: {exc.strerror or exc}")
    if (bad := crashed(proc, "ptxas --version")) is not None:
        return bad
    found = re.search(r"release (\d+\.\d+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or found is None:
        return PtxasProbe(
            path,
            gpu_name,
            "garbage",
            None,
            f"`--version` did not answer like ptxas (exit {proc.returncode}): "
            f"{_first_error_line(proc.stdout + proc.stderr)}",
        )
    version = found.group(1)

    with tempfile.TemporaryDirectory(prefix="slime-gb10-ptxas-") as tmp:
        ptx = Path(tmp, "probe.ptx")
        cubin = Path(tmp, "probe.cubin")
        ptx.write_text(minimal_ptx(gpu_name))
        cmd = [path, f"--gpu-name={gpu_name}", "-o", str(cubin), str(ptx)]
        try:
            proc = _run(cmd, timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return PtxasProbe(
                path, gpu_name, "timeout", version, f"assembling for {gpu_name} ran past {timeout_s:g} s"
            )
        if (bad := crashed(proc, f"ptxas --gpu-name={gpu_name}")) is not None:
            return PtxasProbe(path, gpu_name, "crashed", version, bad.message)
        output = proc.stdout + proc.stderr
        if proc.returncode == 0:
            if cubin.is_file() and cubin.read_bytes()[:4] == b"\x7fELF":
                return PtxasProbe(path, gpu_name, "accepts", version, f"ptxas {version} assembles {gpu_name}")
            return PtxasProbe(
                path, gpu_name, "garbage", version, "exited 0 but wrote no ELF cubin: not a working ptxas"
            )
        if re.search(
            r"is not defined for option 'gpu-name'|does not support \.target|Unsupported \.version", output
        ):
            return PtxasProbe(path, gpu_name, "rejects", version, _first_error_line(output))
        return PtxasProbe(
            path, gpu_name, "failed", version, f"exit {proc.returncode}: {_first_error_line(output)}"
        )


# --- which ptxas Triton uses ---------------------------------------------------------------------


@dataclass(frozen=True)
class TritonPtxas:
    """The ptxas Triton would run for one arch: ``path``, and the variable that overrides it."""

    installed: bool
    triton_version: str | None
    env_var: str  # TRITON_PTXAS_PATH, or TRITON_PTXAS_BLACKWELL_PATH in Triton >= 3.5 for new archs
    path: str | None
    from_env: bool
    bundled: str | None

    @property
    def env_vars(self) -> tuple[str, ...]:
        """Every variable to set so this Triton uses a given ptxas for this arch."""
        return tuple(dict.fromkeys((self.env_var, "TRITON_PTXAS_PATH")))


def triton_dir() -> Path | None:
    spec = importlib.util.find_spec("triton")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _blackwell_threshold(compiler_py: Path) -> int:
    """The arch from which Triton uses ``ptxas-blackwell`` (3.5-3.7: ``>= 100``; 3.9: ``< 90`` legacy)."""
    try:
        text = compiler_py.read_text(errors="replace")
    except OSError:
        return 100
    body = re.search(r"def get_ptxas\(.*?(?=\n(?:def |@|class ))", text, flags=re.S)
    if body:
        if m := re.search(r"arch\s*>=\s*(\d+)", body.group(0)):
            return int(m.group(1))
        if m := re.search(r"arch\s*<\s*(\d+)", body.group(0)):
            return int(m.group(1))
    return 100


def triton_ptxas(capability: tuple[int, int], env: Mapping[str, str] | None = None) -> TritonPtxas:
    """The ptxas the installed Triton uses for a GPU of ``capability`` (without importing Triton).

    Triton reads ``TRITON_PTXAS_PATH`` (and, from 3.5, ``TRITON_PTXAS_BLACKWELL_PATH`` for new archs,
    bundled as ``ptxas-blackwell``), falling back to its bundled binary when the variable is unset.
    """
    env = os.environ if env is None else env
    try:
        from importlib.metadata import PackageNotFoundError, version

        triton_version = version("triton")
    except PackageNotFoundError:
        triton_version = None
    root = triton_dir()
    arch = int(capability[0]) * 10 + int(capability[1])
    if root is None:
        var = "TRITON_PTXAS_PATH"
        return TritonPtxas(False, triton_version, var, env.get(var) or None, bool(env.get(var)), None)
    bindir = root / "backends" / "nvidia" / "bin"
    var, bundled = "TRITON_PTXAS_PATH", bindir / "ptxas"
    if (bindir / "ptxas-blackwell").exists() and arch >= _blackwell_threshold(
        root / "backends" / "nvidia" / "compiler.py"
    ):
        var, bundled = "TRITON_PTXAS_BLACKWELL_PATH", bindir / "ptxas-blackwell"
    user = env.get(var)
    return TritonPtxas(
        True,
        triton_version,
        var,
        user if user else str(bundled),
        bool(user),
        str(bundled),
    )


def cuda_home(env: Mapping[str, str] | None = None) -> Path | None:
    """The CUDA toolkit root, as torch.utils.cpp_extension looks for it: $CUDA_HOME, $CUDA_PATH,
    nvcc's grandparent, /usr/local/cuda. Among the last two, one with CUDA headers is preferred
    (an ``nvcc`` wrapper script in /usr/local/bin would otherwise give /usr/local)."""
    env = os.environ if env is None else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            return Path(env[var])
    guesses: list[Path] = []
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        guesses.append(Path(os.path.realpath(nvcc)).parent.parent)
    if Path("/usr/local/cuda").is_dir():
        guesses.append(Path("/usr/local/cuda"))
    for guess in guesses:
        if (guess / "include" / "cuda_runtime.h").is_file() or any(
            guess.glob("targets/*/include/cuda_runtime.h")
        ):
            return guess
    return guesses[0] if guesses else None


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"cuda-(\d+)(?:\.(\d+))?", path)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (0, 0)


def ptxas_candidates(env: Mapping[str, str] | None = None) -> list[str]:
    """Places a CUDA 13 ptxas may live, best first, without duplicates (existence not checked)."""
    env = os.environ if env is None else env
    found: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            found.append(os.path.join(env[var], "bin", "ptxas"))
    found.append("/usr/local/cuda/bin/ptxas")
    found.extend(sorted(glob.glob("/usr/local/cuda-*/bin/ptxas"), key=_version_key, reverse=True))
    on_path = shutil.which("ptxas", path=env.get("PATH"))
    if on_path:
        found.append(on_path)
    spec = importlib.util.find_spec("nvidia")  # the nvidia-cuda-nvcc wheel: nvidia/cu13/bin/ptxas
    for location in (spec.submodule_search_locations or []) if spec else []:
        found.extend(
            [
                os.path.join(location, "cu13", "bin", "ptxas"),
                os.path.join(location, "cuda_nvcc", "bin", "ptxas"),
            ]
        )
    return list(dict.fromkeys(found))


def find_working_ptxas(
    gpu_name: str,
    candidates: Iterable[str] | None = None,
    timeout_s: float = 20.0,
    *,
    deadline: float | None = None,
) -> PtxasProbe | None:
    """The first candidate that actually assembles ``gpu_name``, or None.

    Each probe gets ``timeout_s``; with ``deadline`` (a ``time.monotonic()`` value) no probe runs
    past it, and none starts after it.
    """
    for candidate in ptxas_candidates() if candidates is None else candidates:
        left = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
        if left <= 0:
            return None
        if os.path.isfile(candidate):
            probe = probe_ptxas(candidate, gpu_name, left)
            if probe.ok:
                return probe
    return None
