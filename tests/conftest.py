"""Shared pytest setup: the ``gpu`` marker skips cleanly on machines without CUDA."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_in_a_terminal():
    """SIGINT as a terminal delivers it: a suite started in the background by a non-interactive shell
    inherits SIGINT ignored (POSIX: an asynchronous command ignores it) and Python keeps it so,
    which is right for the product (a `nohup ... &` run must not stop on Ctrl-C) but is not the
    state the Ctrl-C tests are about. Found by running the suite under load, in the background."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(scope="session")
def torchrun():
    """Runs ``python -m torch.distributed.run --nproc-per-node=N`` on a free local port with ``args``
    (a script or ``-m module ...``), one thread per rank; returns the finished process."""
    import os
    import socket
    import subprocess
    import sys

    def run(*args: str, ranks: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("WORLD_SIZE", None)
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
               "--master-addr=127.0.0.1", f"--master-port={port}", *args]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(
        reason="needs a CUDA GPU (none here); runs on the device / in the flake's GPU checks"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# The real GSM8K splits (MIT; ../shared/data/gsm8k beside the checkout, never copied into the
# repository), checked against the sha256 sums its README publishes.
GSM8K_SHA256 = {
    "test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
}


def _find_gsm8k():
    import os
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent
    candidates = [os.environ.get("SLIME_GB10_GSM8K_DIR", "")]
    candidates += [str(p / "shared" / "data" / "gsm8k") for p in [here, *here.parents]]
    candidates.append("/work/shared/data/gsm8k")
    for c in candidates:
        if c and (Path(c) / "test.jsonl").is_file() and (Path(c) / "train.jsonl").is_file():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def gsm8k_dir():
    """The directory of GSM8K's train.jsonl / test.jsonl (SLIME_GB10_GSM8K_DIR, else ../shared/data/gsm8k)."""
    import hashlib

    found = _find_gsm8k()
    if found is None:
        pytest.skip(
            "the GSM8K files are not here: set SLIME_GB10_GSM8K_DIR to the folder of train.jsonl/test.jsonl"
        )
    for name, digest in GSM8K_SHA256.items():
        assert hashlib.sha256((found / name).read_bytes()).hexdigest() == digest, (
            f"{found / name} is not GSM8K"
        )
    return found
