"""``python -m slime_gb10.platform.probes.all_reduce``: the doctor's all-reduce between torchrun's ranks.

Run by the ``distributed`` check in a child of each rank's doctor (the doctor itself never imports
torch), with torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). Joins the process group (NCCL with GPUs, gloo otherwise), checks that an
all-reduce sums correctly, times it and prints one JSON line.
"""

from __future__ import annotations

import datetime
import json
import os
import time


def bus_bandwidth_gbps(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth as nccl-tests defines it: ``2 (n - 1) / n * bytes / time`` (GB/s),
    the rate each link carries in a ring, comparable across world sizes."""
    return 2 * (world_size - 1) / world_size * nbytes / seconds / 1e9


def main() -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    out = {"rank": rank, "world_size": world, "backend": "nccl" if cuda else "gloo"}
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        out["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    timeout = float(os.environ.get("SLIME_GB10_DIST_PROBE_TIMEOUT", "60"))
    dist.init_process_group(out["backend"], timeout=datetime.timedelta(seconds=timeout))
    device = torch.device("cuda") if cuda else torch.device("cpu")
    nbytes = (64 if cuda else 16) << 20
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    buf.fill_(rank + 1)
    dist.all_reduce(buf)
    out["correct"] = bool((buf == world * (world + 1) / 2).all())
    reps = 5
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / reps
    out.update(bytes=nbytes, seconds=seconds, busbw_gbps=bus_bandwidth_gbps(nbytes, seconds, world))
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
