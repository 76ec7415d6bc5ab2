"""Ask torch about the GPU in a child process: a hang or crash in CUDA init never takes us down.

The child also leaves *this* process's CUDA uninitialised, which matters: ``PYTORCH_ALLOC_CONF`` is
read when the caching allocator starts, so the runtime fixes must know the device before touching it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from slime_gb10.platform import subproc


@dataclass(frozen=True)
class DeviceFacts:
    """What the runtime fixes need to know about one GPU; build it by hand in tests."""

    name: str
    capability: tuple[int, int]
    sm_count: int | None = None
    unified_memory: bool = False
    total_memory: int | None = None
    index: int = 0


@dataclass
class Probe:
    """The child's answer (``data``), or why there is none (``error``)."""

    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def gpu(self) -> bool:
        return bool(self.data.get("cuda_available")) and "device" in self.data

    def facts(self) -> DeviceFacts | None:
        if not self.gpu:
            return None
        from slime_gb10.platform.devices import is_unified_memory

        dev = self.data["device"]
        capability = (int(dev["capability"][0]), int(dev["capability"][1]))
        unified = is_unified_memory(capability, bool(dev.get("is_integrated")))
        return DeviceFacts(
            name=dev["name"],
            capability=capability,
            sm_count=int(dev["sm_count"]),
            unified_memory=unified,
            total_memory=int(dev["total_memory"]),
            index=int(dev["index"]),
        )


def run_probe(index: int = 0, timeout_s: float = 60.0) -> Probe:
    """Run the probe script in a child python; never raises, never waits longer than ``timeout_s``."""
    import time

    start = time.monotonic()
    try:
        proc = subproc.run(
            [sys.executable, "-m", "slime_gb10.platform.probes.torch_device", str(index)],
            timeout_s,
            env=os.environ.copy(),
        )
    except subprocess.TimeoutExpired:
        return Probe(
            error=f"importing torch / initialising CUDA took longer than {timeout_s:g} s",
            seconds=time.monotonic() - start,
        )
    except OSError as exc:
        return Probe(error=f"could not start {sys.executable}: {exc}", seconds=time.monotonic() - start)
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        how = (
            f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
        )
        return Probe(error=f"the torch/CUDA probe {how}: {tail}", seconds=elapsed)
    try:
        return Probe(data=json.loads(lines[-1]), seconds=elapsed)
    except json.JSONDecodeError as exc:
        return Probe(error=f"the torch/CUDA probe printed unreadable output: {exc}", seconds=elapsed)


_lock = threading.Lock()
_cached: dict[int, Probe] = {}


def current_device_facts(index: int = 0, timeout_s: float = 60.0) -> DeviceFacts | None:
    """Facts about GPU ``index`` without initialising CUDA here (unless it already is); None = no GPU."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        from slime_gb10.platform.devices import is_unified_memory

        props = torch.cuda.get_device_properties(index)
        capability = (int(props.major), int(props.minor))
        return DeviceFacts(
            name=props.name,
            capability=capability,
            sm_count=int(props.multi_processor_count),
            unified_memory=is_unified_memory(capability, bool(getattr(props, "is_integrated", False))),
            total_memory=int(props.total_memory),
            index=index,
        )
    with _lock:
        if index not in _cached:
            _cached[index] = run_probe(index, timeout_s)
        return _cached[index].facts()
