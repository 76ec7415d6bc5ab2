"""The ``te`` backend: recipe arguments everywhere; the real TE run only on a Blackwell GPU with TE.

TE's NVFP4 recipe needs Blackwell (sm_100+/sm_120+): the GPU part skips on anything else (the H100
included) and runs in the flake's GPU checks on a GB10.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slime_gb10.nvfp4 import NVFP4Linear
from slime_gb10.nvfp4.linear import is_blackwell, te_available
from slime_gb10.nvfp4.te_backend import nvfp4_recipe_kwargs


def test_recipe_kwargs_on_sm12x_keep_wgrad_in_bf16():
    old_te = {"disable_rht", "override_linear_precision", "fp4_format"}
    new_te = {"disable_rht", "backward_override", "fp4_format"}
    assert nvfp4_recipe_kwargs(old_te, sm12x=True) == {
        "disable_rht": True,
        "override_linear_precision": (False, False, True),
    }
    assert nvfp4_recipe_kwargs(new_te, sm12x=True) == {
        "disable_rht": True,
        "backward_override": "high_precision",
    }
    assert nvfp4_recipe_kwargs(new_te, sm12x=False) == {}
    with pytest.warns(UserWarning, match="weight-gradient"):
        assert nvfp4_recipe_kwargs({"disable_rht"}, sm12x=True) == {"disable_rht": True}


def test_recipe_quantizes_weights_in_the_checkpoint_layout():
    """TE defaults to 16x16 weight tiles; export (ModelOpt/SGLang) uses 1x16 blocks: train on those."""
    te_with_2d = {"disable_rht", "backward_override", "disable_2d_quantization"}
    assert nvfp4_recipe_kwargs(te_with_2d, sm12x=False) == {"disable_2d_quantization": True}
    assert nvfp4_recipe_kwargs(te_with_2d, sm12x=True) == {
        "disable_2d_quantization": True,
        "disable_rht": True,
        "backward_override": "high_precision",
    }


def test_te_backend_needs_cuda():
    layer = NVFP4Linear(32, 16, backend="te")
    assert isinstance(layer.weight, nn.Parameter)
    with pytest.raises(ValueError, match="CUDA"):
        layer(torch.randn(2, 32, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not (is_blackwell() and te_available()), reason="TE NVFP4 needs a Blackwell GPU and TE")
def test_te_backend_forward_backward_on_blackwell():
    torch.manual_seed(0)
    linear = nn.Linear(256, 128, dtype=torch.bfloat16, device="cuda")
    layer = NVFP4Linear.from_linear(linear, backend="te")
    x = torch.randn(64, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out = layer(x)
    ref = linear(x)
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 0.25, float(err)
    out.float().pow(2).mean().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_stochastic_rounding_is_off_on_sm12x_where_te_has_the_field():
    """TE #3062: the default recipe's stochastic-rounding cast exceeds sm_12x's 101,376 bytes of
    shared memory. Off there (where TE's recipe has the field), TE's default elsewhere."""
    te = {"disable_rht", "disable_stochastic_rounding", "backward_override", "disable_2d_quantization"}
    gb10 = nvfp4_recipe_kwargs(te, sm12x=True)
    assert gb10["disable_stochastic_rounding"] is True and gb10["disable_rht"] is True
    assert "disable_stochastic_rounding" not in nvfp4_recipe_kwargs(te, sm12x=False)
    older = {"disable_rht", "backward_override"}  # a TE without the field: nothing to pass
    assert "disable_stochastic_rounding" not in nvfp4_recipe_kwargs(older, sm12x=True)
    # Megatron training keeps TE's 16x16 weight tiles; the sm_12x workarounds are the same
    megatron = nvfp4_recipe_kwargs(te, sm12x=True, one_d_weights=False)
    assert "disable_2d_quantization" not in megatron and megatron["disable_stochastic_rounding"] is True
