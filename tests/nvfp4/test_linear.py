"""NVFP4Linear on the CPU: reference and qat backends, conversions, STE gradients, quantize_model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from slime_gb10.nvfp4 import NVFP4Linear, dequantize, fake_quantize, quantize, quantize_model
from slime_gb10.nvfp4.linear import default_backend, fused_groups, nvfp4_layers


def test_default_backend_on_cpu_is_reference():
    assert default_backend("cpu") == "reference"
    assert NVFP4Linear(32, 8).backend == "reference"


def test_from_linear_reference_forward_is_dequantize_then_matmul():
    torch.manual_seed(0)
    linear = nn.Linear(64, 24, dtype=torch.bfloat16)
    layer = NVFP4Linear.from_linear(linear, backend="reference")
    q = quantize(linear.weight.detach())
    assert torch.equal(layer.weight, q.data) and torch.equal(
        layer.weight_scale.view(torch.uint8), q.scale.view(torch.uint8)
    )
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (24, 32)
    assert layer.weight_scale.dtype == torch.float8_e4m3fn and layer.weight_scale.shape == (24, 4)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    expected = x.float() @ dequantize(q, torch.bfloat16).float().T + linear.bias.float()
    out = layer(x)
    assert out.shape == (3, 5, 24) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)
    # against the original layer: the format's ~10% weight error
    err = (out.float() - linear(x).float()).norm() / linear(x).float().norm()
    assert err < 0.2


def test_to_linear_holds_the_dequantized_weight():
    linear = nn.Linear(32, 16)
    layer = NVFP4Linear.from_linear(linear, backend="reference")
    back = layer.to_linear()
    assert isinstance(back, nn.Linear)
    assert torch.equal(back.weight, dequantize(quantize(linear.weight.detach()), back.weight.dtype))
    assert torch.equal(back.bias, linear.bias.detach().to(back.bias.dtype))


def test_switching_backends_keeps_the_nvfp4_values():
    linear = nn.Linear(48, 16, bias=False, dtype=torch.bfloat16)
    layer = NVFP4Linear.from_linear(linear, backend="reference")
    packed = layer.weight.clone()
    layer.set_backend("qat")
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.dtype == torch.bfloat16
    assert torch.equal(layer.weight, dequantize(quantize(linear.weight.detach()), torch.bfloat16))
    layer.set_backend("reference")  # re-quantizing NVFP4 values gives the same values back
    assert torch.equal(
        layer.dequantized_weight(), dequantize(quantize(linear.weight.detach()), torch.bfloat16)
    )
    # codes too, except that a tiny negative stored as -0 (code 8) comes back as +0 (code 0)
    from slime_gb10.nvfp4.format import unpack_codes

    before, after = unpack_codes(packed), unpack_codes(layer.weight)
    assert torch.equal(torch.where(before == 8, 0, before), after)


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 16"):
        NVFP4Linear(20, 8)
    with pytest.raises(ValueError, match="backend"):
        NVFP4Linear(32, 8, backend="fp4-magic")
    with pytest.raises(ValueError, match=r"input \[\.\.\., 32\]"):
        NVFP4Linear(32, 8)(torch.randn(2, 16))


def test_fake_quantize_straight_through_gradient():
    x = torch.randn(4, 32, requires_grad=True)
    y = fake_quantize(x)
    assert torch.equal(y.detach(), dequantize(quantize(x.detach()), torch.float32))
    g = torch.randn_like(x)
    y.backward(g)
    assert torch.equal(x.grad, g)


def test_the_round_trip_operator_passes_torchs_own_checks():
    """torch.library.opcheck: schema, the fake (shape and contiguous strides, as the real op returns
    even for a transposed input), autograd registration; with and without a global scale."""
    x = torch.randn(32, 16, dtype=torch.float32).t()  # [16, 32], not contiguous
    for scale in (None, torch.tensor(0.01)):
        torch.library.opcheck(torch.ops.slime_gb10.nvfp4_round_trip.default, (x, scale))
    empty = torch.empty(0, 16, requires_grad=True)  # nothing to quantize: no amax, still a tensor
    assert fake_quantize(empty).shape == (0, 16)


def test_qat_layer_compiles_as_one_graph():
    """torch.compile(fullgraph=True) of a QAT layer (weights only, as GRPO's nvfp4-qat trains): the
    round trip is one opaque operator (no graph break, no tracing into the quantizer), forward and
    straight-through gradients equal eager's. The Triton path that made Dynamo fail on an H100 runs
    in tests/grpo/test_quantized.py's GPU test. (Quantized activations read their static scale
    with a host sync, documented in ``activation_global_scale``: a graph break there.)"""
    torch.manual_seed(2)
    linear = nn.Linear(64, 16, dtype=torch.float32)
    layer = NVFP4Linear.from_linear(linear, backend="qat")
    x = torch.randn(5, 64)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    outs, grads = [], []
    for run in (layer, compiled):
        layer.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        out = run(xi)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append((layer.weight.grad.clone(), xi.grad.clone()))
    torch._dynamo.reset()
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("quantize_activations", [False, True])
def test_qat_backward_uses_the_straight_through_estimator(quantize_activations):
    torch.manual_seed(1)
    linear = nn.Linear(32, 8, dtype=torch.float32)
    layer = NVFP4Linear.from_linear(linear, backend="qat", quantize_activations=quantize_activations)
    x = torch.randn(6, 32, requires_grad=True)
    out = layer(x)
    g = torch.randn_like(out)
    out.backward(g)
    w_fq = dequantize(quantize(linear.weight.detach()), torch.float32)
    x_used = dequantize(quantize(x.detach()), torch.float32) if quantize_activations else x.detach()
    torch.testing.assert_close(out.detach(), x_used @ w_fq.T + linear.bias.detach())
    # STE: d out / d W is computed as if the weight were not quantized (in the forward's inputs)
    torch.testing.assert_close(layer.weight.grad, g.T @ x_used)
    torch.testing.assert_close(layer.bias.grad, g.sum(0))
    torch.testing.assert_close(x.grad, g @ w_fq)


def test_qat_trains_a_small_mlp_to_the_bf16_loss_band():
    """QAT reaches the same loss band as full precision on a small regression MLP (CPU version of the
    GPU test; FP32 stands in for BF16 on the CPU)."""

    def train(qat: bool) -> tuple[float, float]:
        torch.manual_seed(0)
        teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 16))
        x = torch.randn(256, 32)
        y = teacher(x).detach()
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 16))
        if qat:
            quantize_model(model, backend="qat", exclude=())
            assert sum(1 for _ in nvfp4_layers(model)) == 2
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(200):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses[0], losses[-1]

    (start, full), (_, qat) = train(False), train(True)
    assert full < 0.1 * start
    assert qat < max(3 * full, 0.05 * start), (start, full, qat)


def test_quantize_model_on_a_transformers_llama(tiny_llama):
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        before = model(ids).logits
    replaced = quantize_model(model)
    assert "lm_head" not in replaced and all("embed" not in n for n in replaced)
    assert len(replaced) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, NVFP4Linear)
    # fused siblings share one global scale (engines fuse q/k/v and gate/up into one GEMM)
    layers = dict(nvfp4_layers(model))
    groups = fused_groups(layers)
    assert len(groups) == 4
    for group in groups:
        scales = {float(layers[n].weight_scale_2) for n in group}
        assert len(scales) == 1
        expected = max(float(layers[n].to_linear().weight.abs().max()) for n in group)
        assert scales.pop() >= expected / 2688 * 0.99
    with torch.no_grad():
        after = model(ids).logits
    assert torch.isfinite(after).all()
    assert torch.corrcoef(torch.stack([before.flatten(), after.flatten()]))[0, 1] > 0.9


def test_quantize_model_include_exclude_and_skips_odd_widths():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 20), nn.Linear(20, 16))
    assert quantize_model(model, include=["0"]) == ["0"]
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 20), nn.Linear(20, 16))
    assert quantize_model(model, exclude=["2"]) == ["0"]  # "3" has in_features 20: not a multiple of 16
    assert isinstance(model[3], nn.Linear) and not isinstance(model[3], NVFP4Linear)


def test_quantize_model_calibrates_the_unquantized_model_with_forward_loop():
    """input_amax = the largest |x| each layer sees in the *unquantized* model (ModelOpt's way; the
    bytes against ModelOpt itself: test_modelopt_parity.py), computed here with a copy of the model
    kept in FP32."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 16))
    original = copy.deepcopy(model)
    batches = [torch.randn(4, 32), 3.0 * torch.randn(2, 32)]
    quantize_model(model, exclude=(), forward_loop=lambda m: [m(b) for b in batches])
    with torch.no_grad():
        hidden = [original[0](b) for b in batches]
        quantized_hidden = [model[0](b) for b in batches]
    assert float(model[0].input_amax) == max(float(b.abs().max()) for b in batches)
    assert float(model[1].input_amax) == max(float(h.abs().max()) for h in hidden)
    assert float(model[1].input_amax) != max(float(h.abs().max()) for h in quantized_hidden)
    # a loop that fails leaves the model as it was: no hooks, nothing replaced
    model = nn.Sequential(nn.Linear(16, 16))

    def broken(m):
        m(torch.ones(1, 16))
        raise RuntimeError("data loader died")

    with pytest.raises(RuntimeError, match="data loader died"):
        quantize_model(model, exclude=(), forward_loop=broken)
    assert type(model[0]) is nn.Linear and not model[0]._forward_pre_hooks


def test_calibrated_activation_quantization_uses_the_static_served_scale():
    """After calibration, activations are fake-quantized with input_amax / 2688 (what the checkpoint
    stores as input_scale and SGLang uses), not each batch's own amax."""
    from slime_gb10.nvfp4 import calibration, fake_quantize
    from slime_gb10.nvfp4.format import global_scale_from_amax

    torch.manual_seed(0)
    linear = nn.Linear(32, 8)
    layer = NVFP4Linear.from_linear(linear, backend="qat", quantize_activations=True)
    model = nn.Sequential(layer)
    calib = torch.randn(4, 32)
    with torch.no_grad(), calibration(model):
        model(calib)
    assert float(layer.input_amax) == float(calib.abs().max())
    big = 3.0 * torch.randn(4, 32)  # larger than anything seen in calibration: the served model clips
    static = global_scale_from_amax(calib.abs().max())
    expected = nn.functional.linear(fake_quantize(big, static), fake_quantize(layer.weight), layer.bias)
    dynamic = nn.functional.linear(fake_quantize(big), fake_quantize(layer.weight), layer.bias)
    with torch.no_grad():
        out = layer(big)
    assert torch.equal(out, expected)
    assert not torch.equal(out, dynamic)
