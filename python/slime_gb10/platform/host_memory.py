"""What the host or a GPU can give a run (:func:`available`): ``MemAvailable``, or a cgroup v2
limit's headroom when lower; a discrete GPU's free memory.

On a GB10 the host's memory is also what the GPU can allocate (unified memory; NVML reports none
there), so :mod:`slime_gb10.grpo.memory_plan` budgets a CPU and a GB10 alike.
"""

from __future__ import annotations

from pathlib import Path

import torch


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


def _gpu(device: torch.device):
    """(index, properties, unified memory?) of a CUDA device."""
    from slime_gb10.platform.devices import is_unified_memory

    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return (
        index,
        props,
        is_unified_memory((props.major, props.minor), bool(getattr(props, "is_integrated", False))),
    )


def uses_host_memory(device: torch.device | str) -> bool:
    """A CPU, or a GPU that shares the host's memory (GB10): every process on the host draws on it."""
    device = torch.device(device)
    return device.type != "cuda" or _gpu(device)[2]


def available(device: torch.device | str) -> tuple[int | None, str]:
    """(bytes free for this run on ``device``, where that number comes from).

    A discrete GPU: ``torch.cuda.mem_get_info``'s free memory. A unified-memory GPU (GB10, compute
    capability 12.1, or any integrated GPU: ``platform.devices.is_unified_memory``) and a CPU: the
    host's ``MemAvailable`` (NVML reports no memory on a GB10, and the GPU's allocations come out
    of the same pool as the CPU's)."""
    device = torch.device(device)
    if device.type != "cuda":
        return host_available()
    index, props, unified = _gpu(device)
    if unified:
        free, source = host_available()
        return free, f"{source}: cuda:{index} ({props.name}) shares the host's memory"
    free, _total = torch.cuda.mem_get_info(index)
    return int(free), f"free memory of cuda:{index} ({props.name}), torch.cuda.mem_get_info"
