"""The doctor under ``torchrun``: the process group, NCCL, the RDMA devices, a timed all-reduce.

Two DGX Sparks talk NCCL over their ConnectX-7 ports (RoCE); without a usable RDMA device NCCL
falls back to TCP sockets at a fraction of the link. The check reads the RDMA devices from sysfs
(no torch in the doctor's process) and runs :mod:`slime_gb10.platform.probes.all_reduce` in a child of
every rank, whose all-reduce meets the other ranks' children.
"""

from __future__ import annotations

import os
from pathlib import Path

from slime_gb10.platform.checks import (
    CheckResult,
    DoctorContext,
    register_check,
    run_child_module,
)

SYSFS_INFINIBAND = Path("/sys/class/infiniband")
NCCL_VARIABLES = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE", "NCCL_NET")


def rdma_devices(root: Path = SYSFS_INFINIBAND) -> list[dict]:
    """The RDMA devices sysfs lists: name, each port's state and link layer (Ethernet = RoCE), and
    the network interfaces behind the device."""
    devices = []
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        ports = []
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:

            def read(name: str, port: Path = port) -> str:
                try:
                    return (port / name).read_text().strip()
                except OSError:
                    return "?"

            ports.append({"port": port.name, "state": read("state"), "link_layer": read("link_layer")})
        net = dev / "device" / "net"
        netdevs = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
        devices.append({"name": dev.name, "ports": ports, "netdevs": netdevs})
    return devices


#: bytes a parameter that one FSDP micro-batch (forward and backward) puts through the collectives
#: on a GPU (grpo/backends/fsdp.py): each layer's weights all-gathered as BF16 for the forward and
#: again for the backward, its FP32 gradients reduce-scattered (the root's embeddings, norm and head
#: are gathered once: slightly less). Under NVFP4 QAT the gathers are FP32: 12.
FSDP_BYTES_PER_PARAMETER = 2 + 2 + 4


def fsdp_seconds_per_billion(world: int, busbw_gbps: float) -> float:
    """Seconds of all-gather and reduce-scatter that one sharded micro-batch of a 1B-parameter model
    needs at the measured bus bandwidth: each rank moves (n - 1) / n of the bytes, at the bus
    bandwidth (nccl-tests define it so for both collectives, as for the all-reduce measured)."""
    return FSDP_BYTES_PER_PARAMETER * (world - 1) / world / busbw_gbps


def megatron_seconds_per_billion(world: int, busbw_gbps: float, distributed_optimizer: bool) -> float:
    """Seconds of collectives that one optimizer step of Megatron-core's data parallelism needs for a
    1B-parameter model (grpo/backends/megatron: overlap off, gradients reduced in FP32): the FP32
    gradient buffer all-reduced, 2 (n - 1) / n of 4 bytes through each rank's links; with the
    distributed optimizer it is reduce-scattered and the BF16 weights all-gathered, (n - 1) / n of
    4 + 2 bytes. Once per step, not per micro-batch as FSDP's."""
    moved = (4 + 2) * (world - 1) / world if distributed_optimizer else 4 * 2 * (world - 1) / world
    return moved / busbw_gbps


def megatron_tp_seconds_per_billion(world: int, busbw_gbps: float) -> float:
    """Seconds of all-reduces that Megatron-core's tensor parallelism over ``world`` ranks needs per
    billion token-channels (trained tokens x layers x hidden size): per layer and token, a BF16
    activation of the hidden size is all-reduced after the attention and after the MLP in the
    forward, and their input gradients in the backward (no sequence parallelism): 4 x 2 bytes, of
    which an all-reduce puts 2 (n - 1) / n through each rank's links. Every micro-batch, every layer:
    the traffic grows with the tokens trained, not with the parameters."""
    return 4 * 2 * 2 * (world - 1) / world / busbw_gbps


def _active(device: dict) -> bool:
    return any("ACTIVE" in port["state"] for port in device["ports"])


@register_check("distributed", before="runtime_fixes")
def check_distributed(ctx: DoctorContext) -> CheckResult:
    """Under torchrun: NCCL (or gloo) joins every rank, an all-reduce sums right, its bus bandwidth; RDMA devices."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return CheckResult.skip(
            "distributed",
            "one process; `torchrun --nproc-per-node N -m slime_gb10 doctor` checks NCCL, RDMA and an all-reduce",
        )
    devices = rdma_devices()
    env = {**os.environ, "SLIME_GB10_DIST_PROBE_TIMEOUT": str(ctx.timeout_s)}
    child = run_child_module("slime_gb10.platform.probes.all_reduce", ctx.timeout_s + 10, env)
    nccl_env = {k: os.environ[k] for k in NCCL_VARIABLES if k in os.environ}
    details = {"rdma_devices": devices, "nccl_env": nccl_env, **(child.data or {})}
    fix = ("check that every rank reaches MASTER_ADDR:MASTER_PORT and the NCCL variables (NCCL_SOCKET_IFNAME, "
           "NCCL_IB_HCA); rerun with NCCL_DEBUG=INFO to see which transport fails")  # fmt: skip
    if failed := child.failed("distributed", f"the all-reduce between the {world} ranks", fix, **details):
        return failed
    data = child.data
    if not data.get("correct"):
        return CheckResult.fail(
            "distributed",
            f"an all-reduce over {world} ranks returned a wrong sum",
            "a broken transport: rerun with NCCL_DEBUG=INFO and NCCL_IB_DISABLE=1 to tell RDMA from sockets",
            **details,
        )
    transport = data["backend"] + (f" {data['nccl_version']}" if "nccl_version" in data else "")
    rdma = ", ".join(d["name"] + ("" if _active(d) else " (down)") for d in devices) or "none"
    reason = (
        f"rank {data['rank']} of {world}: {transport}, all-reduce of {data['bytes'] >> 20} MiB correct, "
        f"{data['busbw_gbps']:.2f} GB/s bus bandwidth; RDMA devices: {rdma}"
    )
    reason += (
        f"; a sharded micro-batch (train.sharding=fsdp) needs >= "
        f"{fsdp_seconds_per_billion(world, data['busbw_gbps']):.2f} s of transfers per billion parameters"
        " (BF16 gathers; 1.5x that with FP32 ones: NVFP4 QAT, model.precision=float32)"
        f"; a Megatron data-parallel step (--trainer megatron) >= "
        f"{megatron_seconds_per_billion(world, data['busbw_gbps'], False):.2f} s per billion (its FP32 gradient "
        f"all-reduce; {megatron_seconds_per_billion(world, data['busbw_gbps'], True):.2f} s with "
        "megatron.use_distributed_optimizer: an FP32 reduce-scatter and a BF16 all-gather)"
        f"; Megatron tensor parallelism over the {world} ranks (megatron.tensor_parallel_size={world}) >= "
        f"{megatron_tp_seconds_per_billion(world, data['busbw_gbps']):.2f} s per billion token-channels "
        "(trained tokens x layers x hidden size: four BF16 activation all-reduces per layer)"
    )
    multi_node = world > int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    sockets = multi_node and data["backend"] == "nccl" and not any(_active(d) for d in devices)
    return CheckResult.ok_unless(
        "distributed",
        reason,
        "no active RDMA device, so NCCL between the boxes runs over TCP sockets" if sockets else None,
        "cable and bring up the ConnectX-7 link, then set NCCL_IB_HCA and NCCL_SOCKET_IFNAME "
        "(README, 'Several GPUs, two Sparks')",
        **details,
    )
