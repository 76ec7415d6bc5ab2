"""The doctor's ``distributed`` check: RDMA devices from a sysfs tree built by hand, the bus
bandwidth formula by hand, and the real thing: two doctors under torchrun whose probes all-reduce
over gloo (CPU)."""

from __future__ import annotations

import json

import pytest

from slime_gb10.platform.checks import DoctorContext
from slime_gb10.platform.checks_distributed import check_distributed, rdma_devices
from slime_gb10.platform.probes.all_reduce import bus_bandwidth_gbps


def test_rdma_devices_read_a_connectx7_sysfs_tree(tmp_path):
    # what a DGX Spark's CX-7 looks like: two RoCE ports of one device, one up, plus a second device down
    for dev, port, state, netdev in (
        ("rocep1s0f0", "1", "4: ACTIVE", "enp1s0f0np0"),
        ("rocep1s0f1", "1", "1: DOWN", "enp1s0f1np1"),
    ):
        (tmp_path / dev / "ports" / port).mkdir(parents=True)
        (tmp_path / dev / "ports" / port / "state").write_text(state + "\n")
        (tmp_path / dev / "ports" / port / "link_layer").write_text("Ethernet\n")
        (tmp_path / dev / "device" / "net" / netdev).mkdir(parents=True)
    devices = rdma_devices(tmp_path)
    assert devices == [
        {"name": "rocep1s0f0", "ports": [{"port": "1", "state": "4: ACTIVE", "link_layer": "Ethernet"}],
         "netdevs": ["enp1s0f0np0"]},
        {"name": "rocep1s0f1", "ports": [{"port": "1", "state": "1: DOWN", "link_layer": "Ethernet"}],
         "netdevs": ["enp1s0f1np1"]},
    ]  # fmt: skip
    assert rdma_devices(tmp_path / "absent") == []


def test_bus_bandwidth_is_nccl_tests_definition():
    # 2 ranks: 2 * 1/2 * 1e9 bytes in 1 s = 1 GB/s; 8 ranks: 2 * 7/8 = 1.75x the algorithm bandwidth
    assert bus_bandwidth_gbps(10**9, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth_gbps(10**9, 0.5, 8) == pytest.approx(3.5)


def test_one_process_is_skipped_with_the_command_to_run(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = check_distributed(DoctorContext())
    assert result.status == "skip" and "torchrun --nproc-per-node N -m slime_gb10 doctor" in result.reason


@pytest.mark.parametrize(
    ("local", "state", "status"), [(2, "1: DOWN", "warn"), (2, "4: ACTIVE", "ok"), (4, "1: DOWN", "ok")]
)
def test_nccl_between_boxes_without_an_active_rdma_device_warns(monkeypatch, local, state, status):
    """Two boxes of two ranks whose RDMA device is down: NCCL runs over sockets, a warning with the
    ok line's reason and what to cable; one box (or an active device) is ok."""
    from slime_gb10.platform import checks_distributed
    from slime_gb10.platform.checks import ChildResult

    data = {"correct": True, "backend": "nccl", "nccl_version": "2.27.7", "rank": 0}
    data.update({"bytes": 64 << 20, "busbw_gbps": 1.5})
    device = {"name": "rocep1s0f0", "ports": [{"port": "1", "state": state, "link_layer": "Ethernet"}]}
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    monkeypatch.setattr(checks_distributed, "rdma_devices", lambda: [device])
    monkeypatch.setattr(checks_distributed, "run_child_module", lambda *a, **k: ChildResult(0, "", "", data))
    result = check_distributed(DoctorContext())
    reason = "rank 0 of 4: nccl 2.27.7, all-reduce of 64 MiB correct, 1.50 GB/s bus bandwidth; RDMA devices: "
    reason += "rocep1s0f0" + (" (down)" if "DOWN" in state else "")
    # 8 bytes a parameter (BF16 gathers twice, FP32 gradients), 3/4 of them through each rank's links,
    # at 1.5 GB/s: 4 s per billion
    reason += (
        "; a sharded micro-batch (train.sharding=fsdp) needs >= 4.00 s of transfers per billion parameters"
        " (BF16 gathers; 1.5x that with FP32 ones: NVFP4 QAT, model.precision=float32)"
    )
    # Megatron's step: an all-reduce of 4-byte gradients moves 2 x 3/4 x 4 = 6 bytes a parameter (4 s
    # at 1.5 GB/s); its distributed optimizer 3/4 x (4 + 2) = 4.5 (3 s)
    reason += (
        "; a Megatron data-parallel step (--trainer megatron) >= 4.00 s per billion (its FP32 gradient "
        "all-reduce; 3.00 s with megatron.use_distributed_optimizer: an FP32 reduce-scatter and a BF16 all-gather)"
    )
    # tensor parallelism: 4 all-reduces of 2 bytes a token-channel, 2 x 3/4 of them through each rank's
    # links: 12 bytes, 8 s per billion at 1.5 GB/s
    reason += (
        "; Megatron tensor parallelism over the 4 ranks (megatron.tensor_parallel_size=4) >= 8.00 s per billion "
        "token-channels (trained tokens x layers x hidden size: four BF16 activation all-reduces per layer)"
    )
    assert result.status == status and result.details["busbw_gbps"] == 1.5
    if status == "warn":
        caveat = "no active RDMA device, so NCCL between the boxes runs over TCP sockets"
        assert result.reason == f"{reason}: {caveat}" and "ConnectX-7" in result.fix
    else:
        assert result.reason == reason and result.fix is None


@pytest.mark.slow
def test_two_doctors_under_torchrun_all_reduce_over_gloo(tmp_path, torchrun):
    proc = torchrun("-m", "slime_gb10", "doctor", "--json-out", str(tmp_path / "doctor.json"))
    headers = [
        line for line in proc.stdout.splitlines() if line.startswith("slime-gb10 ") and " doctor " in line
    ]
    assert len(headers) == 1, proc.stdout + proc.stderr[-2000:]  # rank 0 alone prints the report
    line = next(line for line in proc.stdout.splitlines() if line.split()[1:2] == ["distributed"])
    assert line.startswith("ok") and "of 2: gloo" in line and "correct" in line
    report = json.loads((tmp_path / "doctor.json").read_text())
    check = next(c for c in report["checks"] if c["name"] == "distributed")
    assert check["details"]["world_size"] == 2 and check["details"]["correct"] is True
    assert check["details"]["busbw_gbps"] > 0
