"""The Megatron backend's load of its distributed optimizer's shards (``megatron.use_distributed_optimizer``),
on a CPU: the two megatron-core 0.16 defects ``backend._load_dp_zero`` works around.

Megatron's ``DistributedOptimizer`` allocates its buffers on CUDA, so a CPU cannot build one; the
stand-in below does what its two methods involved do to PyTorch's Adam (the fallback without
TransformerEngine or Apex), as read in megatron-core 0.16's ``optimizer/distrib_optimizer.py``:
``load_state_dict`` puts one shared ``step`` tensor into every parameter's state, and
``load_parameter_state_from_dp_zero`` copies the saved ``param``/``exp_avg``/``exp_avg_sq`` into
every key of that state (``dst_tensors[key].copy_(tensors[key])``), ``step`` included. The whole
path runs on two GPUs in test_megatron_parallel_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (slime-gb10[megatron])")

from slime_gb10.grpo.backends.megatron.backend import _load_dp_zero


class DistributedOptimizerStandIn:
    def __init__(self, adam: torch.optim.Adam):
        self.optimizer = adam

    def load_state_dict(self, saved: dict) -> None:
        shared = torch.tensor(float(saved["step"]))  # megatron: s["step"] = step, for every state
        state = {
            i: {"exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3), "step": shared} for i in range(3)
        }
        groups = [{**g, "params": [0, 1, 2]} for g in self.optimizer.state_dict()["param_groups"]]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def load_parameter_state_from_dp_zero(self, part: dict) -> None:
        for param, values in zip(self.optimizer.param_groups[0]["params"], part["params"], strict=True):
            optim_state = self.optimizer.state[param]
            dst = {"param": param.data, **optim_state}
            for key in dst:  # megatron's loop: a KeyError for "step", which the saved state lacks
                dst[key].copy_(values[key])


def test_a_resumed_distributed_optimizer_counts_each_parameters_steps_apart():
    """Saved after 1 step, loaded, then 1 more step: every parameter's Adam step count is 2 (with
    one shared tensor each step would have added 1 per parameter: 4), and the update equals that
    of the optimizer that was never saved."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(3)]
    adam = torch.optim.Adam(params, lr=0.1)
    grads = [[torch.randn(3) for _ in params] for _ in range(2)]
    for p, g in zip(params, grads[0], strict=True):
        p.grad = g.clone()
    adam.step()
    saved = {
        "params": [
            {"param": p.detach().clone(), **{k: v.clone() for k, v in adam.state[p].items() if k != "step"}}
            for p in params
        ]
    }
    for p, g in zip(params, grads[1], strict=True):  # the run that was never interrupted
        p.grad = g.clone()
    adam.step()

    resumed = [torch.nn.Parameter(torch.zeros(3)) for _ in range(3)]
    standin = DistributedOptimizerStandIn(torch.optim.Adam(resumed, lr=0.1))
    standin.load_state_dict({"step": 1})
    with pytest.raises(KeyError, match="step"):  # the defect, without the workaround
        standin.load_parameter_state_from_dp_zero(saved)
    _load_dp_zero(standin, saved)
    for p, g in zip(resumed, grads[1], strict=True):
        p.grad = g.clone()
    standin.optimizer.step()
    assert [float(standin.optimizer.state[p]["step"]) for p in resumed] == [2.0, 2.0, 2.0]
    for a, b in zip(params, resumed, strict=True):
        assert torch.equal(a.detach(), b.detach())


def test_the_backends_streamed_write_hands_back_what_failed(monkeypatch, tmp_path):
    """checkpoint._save_streamed learns of a failed write (a full disk) only from ``write_state``'s
    return value (the writer returns it once its gathers are done, never raises): the backend must
    pass it on, else a checkpoint without its tensors would be completed and called good."""
    from slime_gb10.grpo.backends.megatron import tp_checkpoint
    from slime_gb10.grpo.backends.megatron.backend import MegatronPolicyBackend

    failure = OSError(28, "No space left on device")
    seen = []
    monkeypatch.setattr(tp_checkpoint, "write_whole_state", lambda backend, d: seen.append(d) or failure)
    assert MegatronPolicyBackend.write_state(object(), tmp_path / "w") is failure and seen == [tmp_path / "w"]
