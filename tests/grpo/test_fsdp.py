"""FSDP's demand on the loop (train.sharding=fsdp, issue #40): every rank runs as many micro-batches
as the rank with the most, the extra ones weighing nothing; under real torchrun, ranks with uneven
micro-batch counts and an untied head take the data-parallel step. Whole sharded runs (the 1-rank
step, exact resume, the final model): test_distributed.py."""

from __future__ import annotations

import pytest
import torch

from slime_gb10.grpo.backends.fsdp import pad_microbatches
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.interfaces import TrainStepResult


class FakeDist:
    """Another rank holds ``theirs`` micro-batches per minibatch; sums add ``their_count``."""

    enabled = True

    def __init__(self, theirs: list[int], their_count: float = 0.0):
        self.theirs, self.their_count = theirs, their_count

    def max(self, values):
        return [max(v, t) for v, t in zip(values, self.theirs, strict=True)]

    def sum(self, values):
        return [v + self.their_count for v in values]


class RecordingBackend:
    sharded = True

    def __init__(self):
        self.steps = []

    def train_step(self, micro, loss_fn):
        self.steps.append(micro)
        return TrainStepResult(loss=0.0, grad_norm=1.0, metrics={})


def two_ranks(torchrun, source: str, model_dir, out, pattern: str = "rank*.json") -> list[dict]:
    """Run ``source`` on 2 ranks under torchrun (argv: the model, ``out``); the JSON files the ranks
    wrote to ``out`` (one per rank: their stdout interleaves)."""
    import json

    script = out / "script.py"
    script.write_text(source)
    run = torchrun(str(script), str(model_dir), str(out), timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob(pattern))]


def sample(tokens: int, advantage: float = 1.0) -> Sample:
    return Sample([1, 2], list(range(3, 3 + tokens)), [-0.5] * tokens, advantage, 1.0, truncated=False)


def test_pad_microbatches_evens_out_the_counts_with_empty_ones():
    groups = [[["a"]], [["b"], ["c"]], []]
    pad_microbatches(groups, FakeDist([3, 1, 2]), lambda: None)
    assert groups == [[["a"], None, None], [["b"], ["c"]], [None, None]]


def test_a_sharded_update_pads_with_micro_batches_that_weigh_nothing():
    """Two local micro-batches (micro_batch_size 2, three samples) against another rank's four: two
    padding ones, whose completion mask is empty and loss scale 0, and the global token count is
    the real tokens' (5 here + the other rank's 7), as without padding."""
    cfg = build_config(overrides={"train.micro_batch_size": 2})
    backend = RecordingBackend()
    samples = [sample(2), sample(1), sample(2)]
    update_policy(backend, samples, cfg, FakeDist([4], their_count=7.0), pad_token_id=0)
    (micro,) = backend.steps
    assert len(micro) == 4
    real, padding = micro[:2], micro[2:]
    assert sum(float(b.completion_mask.sum()) for b, _ in real) == 5
    for _, extras in padding:
        assert extras["loss_scale"] == 0.0 and extras["metric_weight"] == 0.0
    assert all(extras["global_count"] == 12.0 for _, extras in micro)  # the real tokens only


def test_an_unsharded_update_is_not_padded():
    cfg = build_config(overrides={"train.micro_batch_size": 2})
    backend = RecordingBackend()
    backend.sharded = False
    update_policy(backend, [sample(2), sample(1), sample(2)], cfg, FakeDist([4]), pad_token_id=0)
    assert len(backend.steps[0]) == 2
    assert all("loss_scale" not in extras for _, extras in backend.steps[0])


def test_a_padding_micro_batch_gives_every_parameter_a_zero_gradient_and_no_metrics(tokenizer, tmp_path):
    """What FSDP needs of a padding micro-batch: every parameter, an untied LM head's too, gets a
    gradient (FSDP reduce-scatters the parameters that have one: a rank whose head had none sent a
    smaller buffer than the others, found in review), all of it zero, and the pass reports no
    metrics (a rank with padding alone must not average zeros into the step's metrics)."""
    from slime_gb10.grpo import algo
    from slime_gb10.grpo.backends.common import accumulate_gradients
    from slime_gb10.grpo.backends.torch_backend import token_logprobs
    from slime_gb10.grpo.batching import _empty_sample, collate
    from slime_gb10.grpo.models import load_causal_lm, write_random_model

    model = load_causal_lm(write_random_model(tmp_path / "m", tokenizer, tied=False), dtype=torch.float32)
    cfg = build_config(overrides={"algo.entropy_coef": 0.01})
    batch, extras = collate([_empty_sample(0)], 0)
    extras.update(global_count=5.0, loss_scale=0.0, metric_weight=0.0)
    loss, metrics = accumulate_gradients(
        [(batch, extras)],
        device=torch.device("cpu"),
        forward=lambda b: token_logprobs(model, b, temperature=1.0, with_entropy=True, autocast_dtype=None),
        loss_fn=algo.build_loss(cfg.algo, cfg.rollout.max_new_tokens),
        discard_gradients=lambda: None,
    )
    assert loss == 0.0 and metrics == {}
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert not missing and "lm_head.weight" in dict(model.named_parameters())
    assert all(float(p.grad.abs().sum()) == 0.0 for p in model.parameters())


UNEVEN_RANKS = r"""
import json, sys, torch, torch.distributed as dist
from slime_gb10.grpo.backends.fsdp import full_tensor
from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.distributed import DistContext
from slime_gb10.grpo.models import load_causal_lm

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank = dist.get_rank()
cfg = build_config(overrides={"train.micro_batch_size": 1, "train.lr": 1e-2, "train.adam_eps": 1e-3,
                              "algo.entropy_coef": 0.01})
gen = torch.Generator().manual_seed(rank)
samples = [Sample([3, 4 + i], [5, 6 + i, 7][: 1 + i % 3], [-3.0] * (1 + i % 3), float(torch.randn(1, generator=gen)),
                  1.0, truncated=False) for i in range([3, 1][rank])]  # rank 0: 3 micro-batches, rank 1: 1
ctx = DistContext(rank=rank, world_size=2, timeout_s=120)
out = {}
for sharding in ("none", "fsdp"):
    backend = TorchPolicyBackend(load_causal_lm(sys.argv[1], dtype=torch.float32), None, "cpu", train=cfg.train,
                                 sharding=sharding)
    backend.grad_sync = ctx.all_reduce_gradients
    metrics, tokens, grad_norm, loss = update_policy(backend, samples, cfg, ctx, 0)
    weights = {n: full_tensor(p.detach()) for n, p in backend.model.named_parameters()}
    out[sharding] = (metrics, tokens, grad_norm, loss, weights)
(m0, t0, g0, l0, w0), (m1, t1, g1, l1, w1) = out["none"], out["fsdp"]
diff = max(float((w0[n] - w1[n]).abs().max()) for n in w0)
row = {"rank": rank, "diff": diff, "grad_norm": [g0, g1], "loss": [l0, l1], "tokens": [t0, t1],
       "metrics": [sorted(m0), sorted(m1)], "keys": sorted(m0) == sorted(m1),
       "close": all(abs(m0[k] - m1[k]) <= 1e-5 * max(1.0, abs(m0[k])) for k in m0)}
with open(f"{sys.argv[2]}/rank{rank}.json", "w") as f:  # a file per rank: the ranks' stdout interleaves
    json.dump(row, f)
dist.destroy_process_group()
"""


def test_uneven_ranks_with_an_untied_head_take_the_data_parallel_step(tokenizer, tmp_path, torchrun):
    """Real FSDP2 over gloo: rank 0 trains 3 micro-batches, rank 1 one (as zero-variance filtering
    leaves them) on a model with an untied LM head; rank 1 pads with two. The sharded update equals
    the data-parallel one (weights to 1e-6, gradient norm and loss to 1e-5), its metrics and token
    counts are the data-parallel ones (no padding in them)."""

    from slime_gb10.grpo.models import write_random_model

    model_dir = write_random_model(tmp_path / "untied", tokenizer, tied=False, initializer_range=0.3)
    rows = two_ranks(torchrun, UNEVEN_RANKS, model_dir, tmp_path)
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for r in rows:
        assert r["diff"] <= 1e-6, r
        assert r["grad_norm"][1] == pytest.approx(r["grad_norm"][0], rel=1e-5)
        assert r["loss"][1] == pytest.approx(r["loss"][0], rel=1e-5, abs=1e-8)
        assert r["tokens"][0] == r["tokens"][1] and r["keys"] and r["close"], r


NAN_ON_ONE_RANK = r"""
import json, sys, time, datetime, torch, torch.distributed as dist
from slime_gb10.grpo.backends.common import NonFiniteError
from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.distributed import DistContext
from slime_gb10.grpo.models import load_causal_lm

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
rank = dist.get_rank()
cfg = build_config(overrides={"train.micro_batch_size": 1})
advantage = float("nan") if rank == 0 else 1.0  # rank 0's loss is NaN, rank 1's is finite
samples = [Sample([3, 4], [5, 6, 7], [-3.0] * 3, advantage, 1.0, truncated=False)]
ctx = DistContext(rank=rank, world_size=2, timeout_s=60)
for sharding in ("none", "fsdp"):
    backend = TorchPolicyBackend(load_causal_lm(sys.argv[1], dtype=torch.float32), None, "cpu", train=cfg.train,
                                 sharding=sharding)
    backend.grad_sync = ctx.all_reduce_gradients
    start = time.perf_counter()
    try:
        update_policy(backend, samples, cfg, ctx, 0)
        outcome = "trained"
    except NonFiniteError as exc:
        outcome = str(exc)
    dist.barrier()  # both ranks are here: neither waits in a collective the other left
    with open(f"{sys.argv[2]}/rank{rank}-{sharding}.json", "w") as f:
        json.dump({"rank": rank, "sharding": sharding, "outcome": outcome, "s": time.perf_counter() - start}, f)

# a fused group's global scale from sharded weights, one of 1 row (rank 1's shard of it is empty)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from slime_gb10.nvfp4.linear import global_scale_from_amax, shared_global_scale
mesh = init_device_mesh("cpu", (2,))
weights = [torch.tensor([[-3.0, 2.0]]), torch.tensor([[1.0, 0.5], [-2.5, 0.0], [0.25, 1.5]])]
scale = shared_global_scale([distribute_tensor(w, mesh, [Shard(0)]) for w in weights])
with open(f"{sys.argv[2]}/scale{rank}.json", "w") as f:
    json.dump({"scale": float(scale), "want": float(global_scale_from_amax(torch.tensor(3.0)))}, f)
dist.destroy_process_group()
"""


def test_a_non_finite_loss_on_one_rank_stops_every_rank_at_once(tokenizer, tmp_path, torchrun):
    """Rank 0's loss is NaN, rank 1's finite: both ranks raise NonFiniteError in the same step,
    data-parallel and sharded, within seconds (before, rank 0 raised before the gradient reduction
    and rank 1 waited in it until the process group's timeout: 60 s here, 30 min by default). In
    the same launch: a fused group's NVFP4 global scale from sharded weights, one with a single row
    (rank 1's shard of it is empty, which once failed the amax on that rank alone), is the whole
    group's on both ranks."""
    import json

    from slime_gb10.grpo.models import write_random_model

    model_dir = write_random_model(tmp_path / "m", tokenizer, tied=False)
    scales = two_ranks(torchrun, NAN_ON_ONE_RANK, model_dir, tmp_path, "scale*.json")
    assert len(scales) == 2 and all(s["scale"] == s["want"] for s in scales), scales  # max |w| = 3 on rank 0
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted((r["sharding"], r["rank"]) for r in rows) == [
        ("fsdp", 0),
        ("fsdp", 1),
        ("none", 0),
        ("none", 1),
    ]
    for r in rows:
        want = (
            "the loss is nan"
            if r["rank"] == 0
            else "the gradient norm is nan (not finite; on this rank or another)"
        )
        assert r["outcome"].startswith(want) and r["s"] < 30, r


BF16_GATHERS = r"""
import json, sys, torch, torch.distributed as dist
from slime_gb10.grpo.backends.fsdp import full_tensor
from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.distributed import DistContext
from slime_gb10.grpo.models import load_causal_lm

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank = dist.get_rank()
cfg = build_config(overrides={"train.micro_batch_size": 2, "train.lr": 1e-3})
gen = torch.Generator().manual_seed(rank)
samples = [Sample([3, 4 + i], [5, 6 + i, 7, 8], [-3.0] * 4, float(torch.randn(1, generator=gen)), 1.0,
                  truncated=False) for i in range(4)]
ctx = DistContext(rank=rank, world_size=2, timeout_s=120)
out, seen = {}, {}
from slime_gb10.grpo.batching import collate
batch, _ = collate(samples, 0)
gaps = {}
for sharding, quantization in (("none", "none"), ("fsdp", "none"), ("fsdp", "nvfp4-qat")):
    key = f"{sharding}-{quantization}"
    model = load_causal_lm(sys.argv[1], dtype=torch.float32)
    backend = TorchPolicyBackend(model, None, "cpu", train=cfg.train, sharding=sharding,
                                 autocast_dtype=torch.bfloat16, quantization=quantization,
                                 reference_model=load_causal_lm(sys.argv[1], dtype=torch.float32))
    # the reference (the starting policy) computes as the policy does: equal logprobs before an update
    gaps[key] = float((backend.logprobs(batch)[0] - backend.reference_logprobs(batch)).abs().max())
    backend.grad_sync = ctx.all_reduce_gradients
    layer = backend.model.model.layers[0]
    # the dtype of layer 0's up projection as its forward runs (FSDP's gathered weight)
    layer.mlp.up_proj.register_forward_pre_hook(lambda m, a, key=key: seen.setdefault(key, str(m.weight.dtype)) and None)
    metrics, tokens, grad_norm, loss = update_policy(backend, samples, cfg, ctx, 0)
    weights = {n: full_tensor(p.detach()) for n, p in backend.model.named_parameters()}
    masters = sorted({str(p.dtype) for p in backend.model.parameters()})
    moments = sorted({str(v.dtype) for st in backend.optimizer.state.values() for k, v in st.items() if k != "step"})
    out[key] = {"grad_norm": grad_norm, "loss": loss, "weights": weights, "masters": masters, "moments": moments}
base, bf16 = out["none-none"], out["fsdp-none"]
start = dict(load_causal_lm(sys.argv[1], dtype=torch.float32).named_parameters())
moved = [(base["weights"][n] - w).flatten() for n, w in start.items()], [(bf16["weights"][n] - w).flatten()
                                                                         for n, w in start.items()]
moved = torch.cat(moved[0]).detach(), torch.cat(moved[1]).detach()
row = {"rank": rank, "seen": seen, "step": float(moved[0].abs().max()), "gaps": gaps,
       # AdamW's first update is about lr * sign(gradient): the share of weights both moved the same way
       "agree": float((torch.sign(moved[0]) == torch.sign(moved[1])).double().mean()),
       **{f"{k}_{name}": v[name] for k, v in out.items() for name in ("grad_norm", "loss", "masters", "moments")}}
with open(f"{sys.argv[2]}/rank{rank}.json", "w") as f:
    json.dump(row, f)
dist.destroy_process_group()
"""


def test_under_bf16_autocast_the_layers_gather_bf16_and_keep_fp32_masters(tokenizer, tmp_path, torchrun):
    """BF16 autocast (on CPU ranks here, as on a GPU): a sharded layer's forward sees its weights
    gathered as BF16, the shards and AdamW's moments stay FP32, and the step is the data-parallel
    one to BF16's precision: gradient norm and loss to 2%, and AdamW's first update (about lr times
    the gradient's sign) moves over 95% of the weights the same way (a gradient element near 0 may
    change sign in BF16). Under NVFP4 QAT the layers gather FP32 (the fake quantization sees the
    master weights). The reference model is sharded alike: its logprobs equal the policy's before the
    update (KL 0), sharded or not."""

    from slime_gb10.grpo.models import write_random_model

    model_dir = write_random_model(tmp_path / "model", tokenizer, initializer_range=0.3)
    rows = two_ranks(torchrun, BF16_GATHERS, model_dir, tmp_path)
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for r in rows:
        assert r["seen"] == {"none-none": "torch.float32", "fsdp-none": "torch.bfloat16",
                             "fsdp-nvfp4-qat": "torch.float32"}, r  # fmt: skip
        for key in ("none-none", "fsdp-none", "fsdp-nvfp4-qat"):
            assert r[f"{key}_masters"] == ["torch.float32"] and r[f"{key}_moments"] == ["torch.float32"], r
        assert r["fsdp-none_grad_norm"] == pytest.approx(r["none-none_grad_norm"], rel=2e-2)
        assert r["fsdp-none_loss"] == pytest.approx(r["none-none_loss"], rel=2e-2, abs=1e-6)
        assert 5e-4 < r["step"] <= 1.01e-3 and r["agree"] > 0.95, r  # the update moved; both alike
        assert r["gaps"] == {"none-none": 0.0, "fsdp-none": 0.0, "fsdp-nvfp4-qat": 0.0}, r
