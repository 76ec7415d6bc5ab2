"""Sharded checkpoints (train.sharding=fsdp, issue #40) through torch.distributed.checkpoint: each
rank writes its shards; the checkpoint is whole or absent; it loads back at the same world size and
at another (resharding 2 -> 1); and it is read as data. Whole sharded runs through the CLI (exact
resume, resume on one rank): test_distributed.py."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from slime_gb10.grpo.distributed import DistContext
from slime_gb10.grpo.sharded_checkpoint import (
    UnsafeCheckpoint,
    is_sharded_checkpoint,
    load_sharded,
    read_metadata_as_data,
    save_sharded,
)

pytestmark = pytest.mark.slow


def _backend(model_dir, sharding="none"):
    from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
    from slime_gb10.grpo.config import build_config
    from slime_gb10.grpo.models import load_causal_lm

    cfg = build_config(overrides={"train.lr": 1e-2, "train.adam_eps": 1e-3})
    model = load_causal_lm(str(model_dir), dtype=torch.float32)
    return TorchPolicyBackend(model, None, "cpu", train=cfg.train, sharding=sharding), cfg


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    from slime_gb10.grpo.models import write_random_model

    return write_random_model(tmp_path_factory.mktemp("sharded") / "model", tokenizer, tied=False)


def _train_once(backend, cfg, dist=None):
    from slime_gb10.grpo.batching import Sample, update_policy

    samples = [Sample([3, 4], [5, 6, 7], [-3.0] * 3, 1.0, 1.0, truncated=False),
               Sample([3, 9], [8, 6], [-3.0] * 2, -1.0, 1.0, truncated=False)]  # fmt: skip
    update_policy(backend, samples, cfg, dist or DistContext(), 0)


def _whole(backend) -> dict[str, torch.Tensor]:
    """Weights and Adam moments by name, whole (what a checkpoint must give back)."""
    state = backend.sharded_state()
    out = {f"model.{k}": v for k, v in state["model"].items()}
    for name, moments in state["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"optimizer.{name}.{key}"] = moments[key]
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in out.items()}


def test_one_rank_round_trip_and_metadata_read_as_data(model_dir, tmp_path):
    """World size 1 (no process group): a trained backend's state, written sharded and read into a
    fresh backend, gives back every weight, moment, step count and the schedule bit for bit; the
    metadata our reader admits is the one pickle.load reads."""
    backend, cfg = _backend(model_dir)
    _train_once(backend, cfg)
    target = tmp_path / "checkpoints" / "step-000001"
    save_sharded(target, backend.sharded_state(), {"step": 1}, DistContext(), reason="test")
    assert is_sharded_checkpoint(target)
    assert sorted(p.name for p in (target / "policy").iterdir()) == [".metadata", "__0_0.distcp"]
    assert json.loads((target / "meta.json").read_text())["sharded"]["world_size"] == 1
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no temporary left

    with open(target / "policy/.metadata", "rb") as f:
        assert read_metadata_as_data(target / "policy/.metadata") == pickle.load(f)

    fresh, _ = _backend(model_dir)
    fresh.load_state_dict({"sharded_checkpoint": str(target)})
    want, got = _whole(backend), _whole(fresh)
    assert set(got) == set(want) and any(k.endswith("exp_avg_sq") for k in want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert fresh.scheduler.state_dict() == backend.scheduler.state_dict()


class _Marker:
    """A pickled object whose unpickling would create a file: the proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_tampered_metadata_and_items_are_refused_without_running(model_dir, tmp_path):
    backend, cfg = _backend(model_dir)
    _train_once(backend, cfg)
    target = tmp_path / "step-000001"
    save_sharded(target, backend.sharded_state(), {"step": 1}, DistContext(), reason="test")
    proof = tmp_path / "ran"

    metadata = target / "policy/.metadata"
    genuine = metadata.read_bytes()
    # BUILD on an admitted class (not an instance) would rewrite it for the whole process: here
    # PosixPath's _str, after which every path names the attacker's file (found in review)
    build_on_a_class = (
        genuine[:2] + b"cpathlib\nPosixPath\nN}X\x04\x00\x00\x00_strX\x01\x00\x00\x00xs\x86b0" + genuine[2:]
    )
    metadata.write_bytes(build_on_a_class)
    with pytest.raises(UnsafeCheckpoint, match=r"is not data: its BUILD sets the state of <class 'pathlib"):
        read_metadata_as_data(metadata)
    assert str(tmp_path / "a") != "x"
    outside = pickle.loads(genuine)
    for info in outside.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    metadata.write_bytes(pickle.dumps(outside))
    with pytest.raises(UnsafeCheckpoint, match=r"points outside its directory \('\.\./\.\./elsewhere"):
        read_metadata_as_data(metadata)

    # BUILD may set an admitted dataclass's fields only (a __setstate__ or an extend in its
    # __dict__ would be called by a later BUILD or APPENDS), and APPEND(S) add to lists only
    def text(value: str) -> bytes:
        return b"X" + len(value).to_bytes(4, "little") + value.encode()

    storage_info = b"ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n)\x81"
    with_method = b"\x80\x02" + storage_info + b"}" + text("__setstate__") + b"cpathlib\nPosixPath\nsb."
    metadata.write_bytes(with_method)
    with pytest.raises(UnsafeCheckpoint, match="its BUILD gives a _StorageInfo attributes beside its fields"):
        read_metadata_as_data(metadata)
    metadata.write_bytes(b"\x80\x02ctorch\nSize\n)\x85R(" + text("x") + b"e.")
    with pytest.raises(UnsafeCheckpoint, match="its APPENDS adds to a Size"):
        read_metadata_as_data(metadata)
    metadata.write_bytes(pickle.dumps(_Marker(str(proof))))
    with pytest.raises(UnsafeCheckpoint, match=r"\.metadata' is not data: it names (io|builtins)\.open"):
        read_metadata_as_data(metadata)
    fresh, _ = _backend(model_dir)
    with pytest.raises(ValueError, match="is not data"):
        fresh.load_state_dict({"sharded_checkpoint": str(target)})
    metadata.write_bytes(b"\x80\x05not a pickle")
    with pytest.raises(UnsafeCheckpoint, match="is not DCP metadata"):
        read_metadata_as_data(metadata)
    assert not proof.exists()

    # a non-tensor item (DCP stores it with torch.save) that would run code when loaded
    import torch.distributed.checkpoint as dcp

    from slime_gb10.grpo.sharded_checkpoint import POLICY_DIR

    evil = tmp_path / "evil"
    dcp.save(
        {"x": torch.zeros(2), "y": _Marker(str(proof))},
        storage_writer=dcp.FileSystemWriter(evil / POLICY_DIR),
    )
    assert not proof.exists()
    with pytest.raises(ValueError, match=r"(?i)weights.only|unpickl"):
        load_sharded(evil, {"x": torch.ones(2), "y": None})
    assert not proof.exists()


TWO_RANKS = r"""
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
sys.path.insert(0, os.path.dirname(sys.argv[3]))
from test_sharded_checkpoint import _backend, _train_once, _whole
from slime_gb10.grpo.distributed import DistContext
from slime_gb10.grpo.sharded_checkpoint import save_sharded

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank = dist.get_rank()
ctx = DistContext(rank=rank, world_size=2, timeout_s=120)
out = Path(sys.argv[2])
backend, cfg = _backend(sys.argv[1], "fsdp")
assert backend.sharded
_train_once(backend, cfg, ctx)
whole = _whole(backend)
if rank == 0:
    torch.save(whole, out / "whole.pt")

# a rank that fails to write: every rank raises, nothing is left behind
import torch.distributed.checkpoint as dcp
real = dcp.FileSystemWriter.write_data
def failing(self, plan, planner):
    if rank == 1:
        raise OSError(28, "No space left on device")
    return real(self, plan, planner)
dcp.FileSystemWriter.write_data = failing
target = out / "checkpoints" / "step-000001"
try:
    save_sharded(target, backend.sharded_state(), {"step": 1}, ctx, reason="test")
    failed = None
except RuntimeError as exc:
    failed = str(exc)
dcp.FileSystemWriter.write_data = real
dist.barrier()
left = sorted(p.name for p in (out / "checkpoints").iterdir())

save_sharded(target, backend.sharded_state(), {"step": 1}, ctx, reason="test")
files = sorted(p.name for p in (target / "policy").iterdir())
fresh, _ = _backend(sys.argv[1], "fsdp")
fresh.load_state_dict({"sharded_checkpoint": str(target)})
again = _whole(fresh)
same = all(torch.equal(again[k], whole[k]) for k in whole) and set(again) == set(whole)

# a data-parallel run's whole checkpoint state (optimizer keyed by number) into a sharded run: 1 -> 2.
# Rank 1 holds another state (two steps): rank 0's is the checkpoint's, scattered to both.
plain, _ = _backend(sys.argv[1], "none")
for _ in range(1 + rank):
    _train_once(plain, cfg)
if rank == 0:
    torch.save(_whole(plain), out / "plain0.pt")
dist.barrier()
want = torch.load(out / "plain0.pt", weights_only=True)
sharded, _ = _backend(sys.argv[1], "fsdp")
sharded.load_state_dict(plain.state_dict())
got = _whole(sharded)
from_plain = set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
row = {"rank": rank, "failed": failed, "left": left, "files": files, "same": same,
       "scheduler": fresh.scheduler.state_dict() == backend.scheduler.state_dict(), "from_plain": from_plain}
with open(out / f"rank{rank}.json", "w") as f:  # a file per rank: the ranks' stdout interleaves
    json.dump(row, f)
dist.destroy_process_group()
"""


def test_two_ranks_write_their_shards_whole_or_not_at_all_and_one_rank_reads_them(
    model_dir, tmp_path, torchrun
):
    """Real FSDP2 over gloo: a failed write on rank 1 is an error on both ranks naming it and leaves
    no directory; a good one holds one shard file per rank; a fresh sharded backend on 2 ranks and an
    unsharded one on 1 rank (resharding) both read back every weight, Adam moment and step count bit
    for bit (against the 2-rank state gathered before the save); and a data-parallel run's whole
    state (its optimizer's parameters numbered, not named) loads into a sharded run (1 -> 2): rank
    0's, though rank 1 read a different one."""
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    run = torchrun(str(script), str(model_dir), str(tmp_path), __file__, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for r in rows:
        assert r["failed"] and "rank 1" in r["failed"] and "No space left" in r["failed"], r
        assert r["left"] == [], r
        assert r["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"], r
        assert r["same"] and r["scheduler"] and r["from_plain"], r

    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    one, _ = _backend(model_dir)
    assert not one.sharded
    one.load_state_dict({"sharded_checkpoint": str(tmp_path / "checkpoints" / "step-000001")})
    got = _whole(one)
    assert set(got) == set(whole)
    for key, value in whole.items():
        assert torch.equal(got[key], value), key


class _TwoNodes:
    """Rank 0 of two, whose other rank (another node) answers ``theirs`` to every gather."""

    is_main, world_size = True, 2

    def __init__(self, theirs):
        self.theirs = theirs

    def gather(self, obj):
        return [obj, self.theirs]


def test_a_rank_that_cannot_see_the_directory_is_refused_before_anything_is_written(model_dir, tmp_path):
    """Two Sparks without a shared --output: the other node cannot see rank 0's directory (it says
    so in the gather); the save is refused in one line naming the fix and leaves nothing behind. The
    trainer asks the same question of the run directory before it loads anything."""
    from slime_gb10.grpo.sharded_checkpoint import unseen_by

    assert unseen_by(tmp_path, _TwoNodes(True)) is None
    problem = unseen_by(tmp_path, _TwoNodes(False))
    assert (
        problem.startswith("rank(s) 1 cannot see rank 0's directory")
        and "filesystem every node mounts" in problem
    )
    backend, _ = _backend(model_dir)
    target = tmp_path / "checkpoints" / "step-000001"
    with pytest.raises(RuntimeError, match="rank\\(s\\) 1 cannot see"):
        save_sharded(target, backend.sharded_state(), {"step": 1}, _TwoNodes(False), reason="test")
    assert list((tmp_path / "checkpoints").iterdir()) == []
    # rank 0 cannot even make the directory: its failure goes through the gather (no rank waits)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(RuntimeError, match="a_file"):
        save_sharded(tmp_path / "a_file" / "step-000001", backend.sharded_state(), {"step": 1},
                     _TwoNodes((None, None)), reason="test")  # fmt: skip


def test_a_checkpoint_of_step_0_holds_no_moments_and_its_save_takes_no_step(model_dir, tmp_path):
    """Before the first update the optimizer has no state. DCP's state-dict API would make one by
    stepping on zero gradients and count that step (found in review: the first real update then
    came out 0.59x its size); the save writes the weights alone and leaves the optimizer as it was,
    and the load leaves the fresh optimizer empty."""
    from slime_gb10.grpo.sharded_checkpoint import has_optimizer_state

    backend, cfg = _backend(model_dir)
    target = tmp_path / "step-000000"
    save_sharded(target, backend.sharded_state(), {"step": 0}, DistContext(), reason="interrupt")
    assert backend.optimizer.state == {} and not has_optimizer_state(target)
    fresh, _ = _backend(model_dir)
    fresh.load_state_dict({"sharded_checkpoint": str(target)})
    assert fresh.optimizer.state == {}
    _train_once(backend, cfg)
    _train_once(fresh, cfg)
    for name, value in backend.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[name], value), name


def test_an_incomplete_step_directory_makes_way_and_another_models_state_is_one_line(
    model_dir, tmp_path, tokenizer
):
    """A step-N without meta.json (a crash's leftover, an NFS remove that left a file) is replaced,
    not an error; a data-parallel state of another model is a ValueError naming it (restore turns
    it into one line), not an IndexError."""
    from slime_gb10.grpo.backends.torch_backend import _optimizer_state_by_name

    backend, cfg = _backend(model_dir)
    _train_once(backend, cfg)
    target = tmp_path / "checkpoints" / "step-000001"
    (target / "policy").mkdir(parents=True)
    (target / ".nfs0001").write_text("left behind")
    save_sharded(target, backend.sharded_state(), {"step": 1}, DistContext(), reason="test")
    assert is_sharded_checkpoint(target) and not (target / ".nfs0001").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["step-000001"]

    state = backend.state_dict()["optimizer"]
    state["param_groups"][0]["params"] = state["param_groups"][0]["params"][:-1]
    with pytest.raises(ValueError, match=r"optimizer state is of \d+ parameters, this model trains \d+"):
        _optimizer_state_by_name(backend.model, state)


class _RankOne:
    """Rank 1 of two: rank 0's answer to each gather is scripted."""

    enabled, is_main, rank, world_size = True, False, 1, 2

    def __init__(self, *theirs):
        self.theirs = list(theirs)

    def gather(self, obj):
        return [self.theirs.pop(0), obj]


def test_every_rank_resumes_the_checkpoint_rank_0_chose(tmp_path, monkeypatch):
    """Played from rank 1, rank 0's answers scripted: rank 0's pick (here the older step 1, as when
    it could not read step 2) is the one rank 1 reads, not the newest it sees; a problem on rank 0
    is rank 1's error too; rank 1's own problem, a CheckpointError or an OSError (a stale NFS
    handle), goes to every rank as one line."""
    from slime_gb10.grpo.checkpoint import CheckpointError, agreed_resume, save_checkpoint

    for step in (1, 2):
        save_checkpoint(tmp_path, step, {"model": {}}, {"step": step}, keep=5)
    chosen = str(tmp_path / "checkpoints" / "step-000001")
    path, _, trainer = agreed_resume(tmp_path, _RankOne((chosen, None), None))
    assert str(path) == chosen and trainer["step"] == 1
    problem = "--resume: no readable checkpoint under ..."
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        agreed_resume(tmp_path, _RankOne((None, problem), problem))
    # rank 0 chose one that rank 1 cannot read: rank 1 says so, and every rank raises that
    (tmp_path / "checkpoints/step-000001/trainer.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="rank 1: cannot read checkpoint file"):
        agreed_resume(tmp_path, _RankOne((chosen, None), None))
    from slime_gb10.grpo import checkpoint

    def stale(path):
        raise OSError(116, "Stale file handle")

    monkeypatch.setattr(checkpoint, "load_checkpoint", stale)
    with pytest.raises(
        CheckpointError, match=r"rank 1: --resume: cannot read '.*step-000001': Stale file handle"
    ):
        agreed_resume(tmp_path, _RankOne((chosen, None), None))
