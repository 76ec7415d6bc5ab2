"""What compiled extension modules carry: their NEEDED libraries and the GPU archs of their code.

* ``elf_needed``: the ``DT_NEEDED`` entries of an ELF shared object, read with the standard
  library (``readelf -d`` without binutils). A ``libcudart.so.12`` there on a CUDA 13 system is
  blocker #2.
* ``cuobjdump_archs``: the SASS (``--list-elf``) and PTX (``--list-ptx``) archs a ``.so`` embeds.
  Lines look like ``ELF file    1: libfoo.1.sm_90a.cubin`` / ``PTX file    1: libfoo.1.sm_90.ptx``.
* ``runs_on``: whether such code runs on a device: ``sm_XY`` SASS on the same major with minor
  ``<= device minor`` (sm_120 runs on sm_121), ``sm_XYa`` only on exactly XY, ``sm_XYf`` on the
  family; PTX ``compute_XY`` (JIT) on any device ``>= XY``.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from slime_gb10.platform import subproc

DT_NEEDED = 1
SHT_DYNAMIC = 6


def elf_needed(path: str | os.PathLike) -> list[str]:
    """The DT_NEEDED sonames of an ELF file (empty list if it is not ELF or has no dynamic section).

    The file is memory-mapped, not read: CUDA libraries are hundreds of MB.
    """
    with open(path, "rb") as fh:
        if fh.read(4) != b"\x7fELF":
            return []
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _needed(data)


def _needed(data) -> list[str]:
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        sh_fmt, dyn_fmt = end + "IIQQQQIIQQ", end + "qQ"
    else:
        (shoff,) = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        sh_fmt, dyn_fmt = end + "IIIIIIIIII", end + "iI"
    sections = [struct.unpack_from(sh_fmt, data, shoff + i * shentsize) for i in range(shnum)]
    needed: list[str] = []
    for sec in sections:
        if sec[1] != SHT_DYNAMIC:
            continue
        offset, size, link = sec[4], sec[5], sec[6]
        strtab_off = sections[link][4]
        step = struct.calcsize(dyn_fmt)
        for pos in range(offset, offset + size, step):
            tag, val = struct.unpack_from(dyn_fmt, data, pos)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                stop = data.find(b"\0", strtab_off + val)
                needed.append(data[strtab_off + val : stop].decode(errors="replace"))
    return needed


CU12_LIB = re.compile(
    r"^lib(cudart|nvrtc|cublas|cublasLt|cusparse|cusolver|cufft|curand|nvJitLink)\.so\.12\b"
)


def cuda12_libs(needed: Iterable[str]) -> list[str]:
    return [lib for lib in needed if CU12_LIB.match(lib)]


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, under CUDA_HOME, or the copy Triton bundles."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    from slime_gb10.platform.ptxas import cuda_home, triton_dir

    places = []
    if (home := cuda_home()) is not None:
        places.append(home / "bin" / "cuobjdump")
    if (tdir := triton_dir()) is not None:
        places.append(tdir / "backends" / "nvidia" / "bin" / "cuobjdump")
    for place in places:
        if place.is_file() and os.access(place, os.X_OK):
            return str(place)
    return None


_ELF_LINE = re.compile(r"^ELF file\s+\d+:\s+\S*?\.(sm_\d+[af]?)\.cubin\s*$")
_PTX_LINE = re.compile(r"^PTX file\s+\d+:\s+\S*?\.sm_(\d+[af]?)\.ptx\s*$")


def parse_cuobjdump_list(text: str) -> tuple[set[str], set[str]]:
    """(SASS archs like ``sm_90a``, PTX archs like ``compute_90``) from --list-elf / --list-ptx output."""
    sass, ptx = set(), set()
    for line in text.splitlines():
        if m := _ELF_LINE.match(line.strip()):
            sass.add(m.group(1))
        elif m := _PTX_LINE.match(line.strip()):
            ptx.add(f"compute_{m.group(1)}")
    return sass, ptx


@dataclass
class ArchScan:
    sass: set[str] = field(default_factory=set)
    ptx: set[str] = field(default_factory=set)
    files_scanned: int = 0
    errors: list[str] = field(default_factory=list)


def cuobjdump_archs(
    files: Iterable[str | os.PathLike], cuobjdump: str, timeout_s: float = 20.0, budget_s: float = 60.0
) -> ArchScan:
    """Union of the archs embedded in ``files`` (each cuobjdump run limited to ``timeout_s``)."""
    import time

    scan = ArchScan()
    deadline = time.monotonic() + budget_s
    for path in files:
        left = deadline - time.monotonic()
        if left <= 0:
            scan.errors.append("time budget spent; remaining files not scanned")
            break
        for flag in ("--list-elf", "--list-ptx"):
            try:
                proc = subproc.run([cuobjdump, flag, str(path)], min(timeout_s, left))
            except subprocess.TimeoutExpired:
                scan.errors.append(f"cuobjdump {flag} {Path(path).name} ran past its time limit")
                continue
            except OSError as exc:
                scan.errors.append(f"cannot run cuobjdump: {exc}")
                return scan
            sass, ptx = parse_cuobjdump_list(proc.stdout)
            scan.sass |= sass
            scan.ptx |= ptx
        scan.files_scanned += 1
    return scan


def _split(arch: str) -> tuple[int, int, str]:
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", arch)
    if not m:
        raise ValueError(f"not an arch name: {arch!r}")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code compiled for ``arch`` (``sm_120``, ``sm_121a``, ``compute_120``...) runs on ``capability``."""
    major, minor, suffix = _split(arch)
    dev_major, dev_minor = capability
    if arch.startswith("compute_"):
        if suffix == "a":
            return (major, minor) == (dev_major, dev_minor)
        if suffix == "f":
            return major == dev_major and minor <= dev_minor
        return (major, minor) <= (dev_major, dev_minor)
    if suffix == "a":
        return (major, minor) == (dev_major, dev_minor)
    return major == dev_major and minor <= dev_minor


def compatible(archs: Iterable[str], capability: tuple[int, int]) -> list[str]:
    return sorted(arch for arch in archs if runs_on(arch, capability))
