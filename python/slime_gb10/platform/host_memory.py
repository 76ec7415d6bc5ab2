"""What the host can give a run: ``MemAvailable``, or a cgroup v2 limit's headroom when lower.

On a GB10 this is also what the GPU can allocate (unified memory; NVML reports none there), so
:mod:`slime_gb10.grpo.memory_plan` reads it for a CPU and a GB10 alike.
"""

from __future__ import annotations

from pathlib import Path


def _read_int(path: Path) -> int | None:
    text = path.read_text().strip() if path.is_file() else ""
    return int(text) if text.isdigit() else None


def _stat_field(path: Path, field: str) -> int:
    try:
        return next(
            (int(v) for k, v in (line.split() for line in path.read_text().splitlines()) if k == field), 0
        )
    except (OSError, ValueError):
        return 0


def host_available(
    meminfo: str | Path = "/proc/meminfo", cgroup: str | Path = "/sys/fs/cgroup"
) -> tuple[int | None, str]:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or a cgroup v2 limit's headroom
    (``memory.max`` - ``memory.current`` + ``inactive_file``) when that is lower; (None, why) where neither can be read."""
    free = None
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    source = "MemAvailable in /proc/meminfo"
    limit, used = _read_int(Path(cgroup) / "memory.max"), _read_int(Path(cgroup) / "memory.current")
    if used is not None:  # memory.current counts page cache the kernel reclaims: the working set doesn't
        used -= _stat_field(Path(cgroup) / "memory.stat", "inactive_file")
    if limit is not None and used is not None and (free is None or limit - used < free):
        free, source = max(0, limit - used), "the cgroup's memory.max - its working set"
    return free, source if free is not None else "no /proc/meminfo"
