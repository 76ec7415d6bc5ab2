"""A Llama-family decoder's forward over a static KV cache, for the torch engine's decode steps.

:class:`StaticDecoder` drives the HF model's own modules (norms, projections, MLPs, rotary
embedding) with shape-static ops and no host syncs, so a one-token step can be compiled and captured
as a CUDA graph (:mod:`~slime_gb10.grpo.engines.torch.engine` does both); :func:`fuse_projections`
puts each layer's q/k/v and gate/up weights in one matrix each. On a GPU a one-token step attends
through :mod:`~slime_gb10.grpo.engines.torch.decode_attention`'s kernels. With NVFP4 rollouts
(:func:`attach_decode_weights`) a one-token step multiplies by the layers' 4-bit codes through the
fused W4A16 kernel wherever that beats a BF16 GEMM at the batch's M.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from slime_gb10.grpo.engines.torch import decode_attention
from slime_gb10.nvfp4.decode_weights import DecodeWeight, decode_linear, decode_pays

STATIC_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")


def supports_static_decoding(model) -> bool:
    """True for decoder-only models whose layers :class:`StaticDecoder` knows how to drive."""
    config = model.config
    if getattr(config, "model_type", None) not in STATIC_ARCHITECTURES:
        return False
    # Mistral has no use_sliding_window flag: a set sliding_window means it is on. Qwen2/Qwen3 carry
    # a sliding_window value but use it only with use_sliding_window=True.
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    base = getattr(model, "model", None)
    return base is not None and hasattr(base, "rotary_emb") and hasattr(base, "layers")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


#: K slices of a one-token step's down projection on a GPU (see :func:`split_k_linear`). Shape B's
#: rollout on an H100 (``benchmarks/grpo/dev/rollout_variants.py``, one process): one GEMM 0.804 s,
#: 2 slices 0.781 s, 4 slices 0.764 s
DOWN_SPLIT_K = 4
#: ... and of its o projection: 4 down slices and 2 o slices 0.747 s
O_SPLIT_K = 2
#: ... and of its fused q/k/v projection, whose partial products the decode kernel sums
#: (decode_attention.decode_step): 5.2 us as one GEMM, 4.3 us over 2 slices (decode_gemm_sweep.py)
QKV_SPLIT_K = 2


def split_k_partials(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """The FP32 products ``[splits, rows, N]`` of ``x`` ``[..., K]`` and ``weight`` ``[N, K]`` over
    ``splits`` slices of K (their sum is ``x @ weight.T``); see :func:`split_k_linear`."""
    k = x.shape[-1]
    rows, n = x.numel() // k, weight.shape[0]
    slices = x.reshape(rows, splits, k // splits).transpose(0, 1)  # [splits, rows, K / splits]
    weights = weight.t().view(splits, k // splits, n)  # weight [N, K] row-major: a view
    if x.is_cuda:
        return torch.bmm(slices, weights, out_dtype=torch.float32)
    return torch.bmm(slices.float(), weights.float())


def split_k_linear(x: torch.Tensor, linear: torch.nn.Linear, splits: int) -> torch.Tensor:
    """``linear(x)`` as ``splits`` GEMMs over slices of the input dimension K, their FP32 partial
    products summed in FP32 and rounded once to ``x``'s dtype.

    A decode step multiplies ~100-200 rows by weights with few output columns (shape B's down
    projection: 160 x 4864 by 4864 x 896). cuBLAS covers those outputs with 84 tiles of 64 x 32, fewer
    than the H100's 132 SMs, each walking all of K: 11.5 us for 8.7 MB of weights, 0.75 TB/s.
    ``torch.bmm`` over 4 slices of K fills the GPU, 6.4 us (``benchmarks/grpo/dev/decode_gemm_sweep.py``,
    24 weight copies per graph so they come from DRAM; issue #27), and inside the compiled step the
    sum of the slices joins the residual add and the next RMSNorm. cuBLAS has no split-K we can ask
    for through torch, hence the slices by hand. On a CPU the slices are multiplied in FP32 (same
    arithmetic; ``bmm``'s FP32 output for BF16 inputs is CUDA-only)."""
    out = split_k_partials(x, linear.weight, splits).sum(0)
    if linear.bias is not None:
        out = out + linear.bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], linear.weight.shape[0])


def _splits_for(weight: torch.Tensor | None, splits: int) -> int:
    """``splits`` where :func:`split_k_partials` can slice ``weight`` in place, else 1."""
    ok = weight is not None and weight.is_contiguous() and weight.shape[1] % splits == 0
    return splits if ok else 1


FUSED_QKV = "_slime_gb10_qkv"
FUSED_GATE_UP = "_slime_gb10_gate_up"
#: the module attribute holding the NVFP4 codes a decode step multiplies by (attach_decode_weights):
#: on the attention for its fused q/k/v, on the MLP for its fused gate/up, on o_proj and down_proj
DECODE_WEIGHT = "_slime_gb10_nvfp4"


@torch.no_grad()
def fuse_projections(model) -> int:
    """Store each layer's q/k/v weights (and biases) in one matrix and gate/up in another, with the
    original parameters re-pointed to views of them; returns the number of layers fused.

    Decoding a batch of ~100-200 rows is bound by reading the weights, and three skinny GEMMs read
    them no faster than one wide one but pay three launches and three under-filled grids (in the
    profile of shape B on an H100: ~1 ms of GEMMs per decode step against ~0.27 ms of weight reads).
    The parameters stay the model's parameters (views), so weight sync, the HF forward and the
    prefill see exactly the same numbers: ``param.copy_`` writes into the fused matrix.
    """

    def fuse(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = torch.cat([lin.weight for lin in linears])
        biases = [lin.bias for lin in linears]
        bias = torch.cat(biases) if all(b is not None for b in biases) else None
        start = 0
        for lin in linears:
            rows = lin.weight.shape[0]
            lin.weight.data = weight[start : start + rows]
            if bias is not None:
                lin.bias.data = bias[start : start + rows]
            start += rows
        return weight, bias

    fused_layers = 0
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj")]
        if all(isinstance(p, torch.nn.Linear) for p in projections):
            if any(p.bias is not None for p in projections) and not all(
                p.bias is not None for p in projections
            ):
                continue  # mixed biases: leave this layer alone
            setattr(attn, FUSED_QKV, fuse(projections))
            fused_layers += 1
        gate_up = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj")]
        if all(isinstance(p, torch.nn.Linear) and p.bias is None for p in gate_up) and hasattr(mlp, "act_fn"):
            setattr(mlp, FUSED_GATE_UP, fuse(gate_up)[0])
    return fused_layers


@torch.no_grad()
def attach_decode_weights(model, names: Iterable[str]) -> dict[str, DecodeWeight]:
    """NVFP4 buffers for the linear layers ``names`` (qualified module names; call after
    :func:`fuse_projections`), by weight name (``<layer>.weight``). Fused q/k/v and gate/up get one
    buffer each, whose rows the siblings' entries view, as the fused BF16 matrix does; the buffers a
    decode step reads are attached to the modules under :data:`DECODE_WEIGHT`. Zero-filled: the
    caller loads them (the engine: from its own weights, then at each weight sync)."""
    names = set(names)
    device = next(model.parameters()).device
    modules = dict(model.named_modules())
    qualified = {module: name for name, module in modules.items()}
    weights: dict[str, DecodeWeight] = {}

    def fused(owner, siblings, matrix) -> None:
        if matrix is None or not all(qualified.get(m) in names for m in siblings):
            return
        whole = DecodeWeight(tuple(matrix.shape), device)
        setattr(owner, DECODE_WEIGHT, whole)
        start = 0
        for module in siblings:
            rows = module.weight.shape[0]
            weights[f"{qualified[module]}.weight"] = whole.rows(start, start + rows)
            start += rows

    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = getattr(attn, FUSED_QKV, None)
        fused(attn, [attn.q_proj, attn.k_proj, attn.v_proj], qkv[0] if qkv else None)
        fused(mlp, [mlp.gate_proj, mlp.up_proj], getattr(mlp, FUSED_GATE_UP, None))
        for module in (attn.o_proj, mlp.down_proj):
            if qualified.get(module) in names:
                setattr(module, DECODE_WEIGHT, DecodeWeight(tuple(module.weight.shape), device))
                weights[f"{qualified[module]}.weight"] = getattr(module, DECODE_WEIGHT)
    for name in names:  # layers the decoder does not take apart: their BF16 copy serves
        weights.setdefault(f"{name}.weight", DecodeWeight(tuple(modules[name].weight.shape), device))
    return weights


def layer_codes(layer, rows: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """The NVFP4 weights a one-token step of ``rows`` rows multiplies by in ``layer`` -- fused q/k/v,
    o, fused gate/up, down -- each None where the layer has none or a BF16 GEMM is faster at this M
    (:func:`~slime_gb10.nvfp4.decode_weights.decode_pays`), decided once per decoder, outside the
    compiled step."""
    owners = (layer.self_attn, layer.self_attn.o_proj, layer.mlp, layer.mlp.down_proj)
    weights = (getattr(owner, DECODE_WEIGHT, None) for owner in owners)
    return tuple(w if w is not None and decode_pays(w, rows, dtype, device) else None for w in weights)


class StaticDecoder:
    """Forward of a Llama-family HF model over a static KV cache ``[B, kv_heads, L, head_dim]``.

    Uses the model's own modules (so the weights the engine receives are the weights used) and
    only shape-static torch ops, no host syncs: a decode step is CUDA-graph capturable. Rotary
    embedding as in HF Llama: ``q * cos + rotate_half(q) * sin``.
    """

    def __init__(self, model, batch: int, cache_len: int):
        self.model = model
        base = model.model
        config = model.config
        self.layers = list(base.layers)
        self.norm = base.norm
        self.rotary = base.rotary_emb
        self.embed = base.embed_tokens
        self.lm_head = model.get_output_embeddings()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.batch, self.cache_len = batch, cache_len
        param = next(model.parameters())
        shape = (batch, self.num_kv_heads, cache_len, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in self.layers]
        self.splits = (self.num_heads * self.head_dim, *(2 * (self.num_kv_heads * self.head_dim,)))
        # one-token steps attend through the grouped-query decode kernel where it runs (decode_attention.py)
        self.decode_kernel = decode_attention.available(
            param.device, param.dtype, self.num_heads, self.num_kv_heads, self.head_dim
        )
        # ... with the rotary embedding and the cache writes in the same kernel (decode_attention.decode_step)
        self.fused_step = self.decode_kernel
        # one-token steps on a GPU: the narrow projections split over K (split_k_linear)
        gpu = param.device.type == "cuda"
        self.o_splits = O_SPLIT_K if gpu else 1
        self.qkv_splits = QKV_SPLIT_K if gpu else 1
        self.down_splits = DOWN_SPLIT_K if gpu else 1
        # NVFP4 rollouts: per layer, the codes a one-token step multiplies by (attach_decode_weights)
        self.codes = [layer_codes(layer, batch, param.dtype, param.device) for layer in self.layers]
        self.no_codes = (None,) * 4
        self.step = self.forward  # the one-token decode step; torch.compile'd when the engine says so

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T] (rotary positions)
        cache_position: torch.Tensor,  # [T] slots of the static cache to write
        attention_mask: torch.Tensor,  # [B, 1, T, S] bool, True = attend; S <= L
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of the LAST position; writes the K/V of all ``T`` positions into the cache.

        Attention reads the first ``S`` slots of the cache, ``S`` the mask's last dimension: the
        decode loop passes the slots written so far rounded up to a bucket (:func:`attention_length`),
        so a step reads the KV it needs and not the whole buffer."""
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, D]
        batch, length = input_ids.shape
        for i, layer in enumerate(self.layers):
            qkv_codes, o_codes, gate_up_codes, down_codes = self.codes[i] if length == 1 else self.no_codes
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            fused = getattr(attn, FUSED_QKV, None)
            scale = getattr(attn, "scaling", None) or self.head_dim**-0.5  # SDPA's default when unset
            if length == 1 and self.fused_step and fused is not None and not hasattr(attn, "q_norm"):
                # one kernel rotates q and the new key, writes the new key and value into the cache
                # and attends (decode_attention.decode_step)
                weight, bias = fused
                splits = _splits_for(weight, self.qkv_splits) if self.qkv_splits > 1 else 1
                if qkv_codes is not None:  # NVFP4 rollouts: the fused W4A16 kernel
                    qkv, bias = decode_linear(x, qkv_codes, bias).view(batch, -1), None
                elif splits > 1:  # the kernel sums the partial products and adds the bias
                    qkv = split_k_partials(x, weight, splits)
                else:
                    qkv, bias = torch.nn.functional.linear(x, weight, bias).view(batch, -1), None
                out = decode_attention.decode_step(
                    qkv,
                    cos,
                    sin,
                    self.keys[i],
                    self.values[i],
                    attention_mask[:, 0, 0, :],
                    cache_position,
                    self.num_heads,
                    scale,
                    bias,
                )
            else:
                out = self._attention(
                    i, attn, x, fused, cos, sin, cache_position, attention_mask, scale, qkv_codes
                )
            out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
            o_splits, down_splits = (self.o_splits, self.down_splits) if length == 1 else (1, 1)
            hidden = residual + self._linear(attn.o_proj, out, o_splits, o_codes)
            normed = layer.post_attention_layernorm(hidden)
            hidden = hidden + self._mlp(layer.mlp, normed, down_splits, (gate_up_codes, down_codes))
        last = self.norm(hidden[:, -1, :])
        return self.lm_head(last)

    def _attention(
        self, i, attn, x, fused, cos, sin, cache_position, attention_mask, scale, codes=None
    ) -> torch.Tensor:
        """Layer ``i``'s attention ``[B, H, T, D]`` from its normed input ``x``, in separate ops:
        projections, rotary embedding, the cache writes, then the decode kernel (one-token steps)
        or SDPA (the prefill, and where the kernel does not run)."""
        batch, length = x.shape[:2]
        span = attention_mask.shape[-1]
        if codes is not None and fused is not None:  # NVFP4 rollouts: the fused W4A16 kernel
            q, k, v = decode_linear(x, codes, fused[1]).split(self.splits, dim=-1)
        elif fused is not None:  # one GEMM for q, k and v (see fuse_projections)
            q, k, v = torch.nn.functional.linear(x, *fused).split(self.splits, dim=-1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(batch, length, self.num_heads, self.head_dim)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.keys[i].index_copy_(2, cache_position, k)
        self.values[i].index_copy_(2, cache_position, v)
        keys, values = self.keys[i][:, :, :span], self.values[i][:, :, :span]
        if length == 1 and self.decode_kernel:
            out = decode_attention.decode_attention(q, keys, values, attention_mask[:, 0, 0, :], scale)
        else:
            out = self.attend(q, keys, values, attention_mask, scale)
        return out

    @staticmethod
    def attend(q, keys, values, mask, scale) -> torch.Tensor:
        """``q`` ``[B, H, T, D]`` over the cache slots ``[B, H_kv, S, D]`` where ``mask`` ``[B, 1, T, S]``
        allows (GQA without repeating the cache)."""
        gqa = keys.shape[1] != q.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa
        )

    @staticmethod
    def _linear(linear, x: torch.Tensor, splits: int, codes: DecodeWeight | None = None) -> torch.Tensor:
        """``linear(x)``, over ``splits`` slices of K where the weight allows (:func:`split_k_linear`);
        by the layer's NVFP4 ``codes`` where given (one-token steps: :func:`layer_codes`)."""
        if codes is not None:
            return decode_linear(x, codes, linear.bias)
        if splits > 1:
            splits = _splits_for(linear.weight, splits) if isinstance(linear, torch.nn.Linear) else 1
        return split_k_linear(x, linear, splits) if splits > 1 else linear(x)

    @classmethod
    def _mlp(cls, mlp, x: torch.Tensor, down_splits: int = 1, codes: tuple = (None, None)) -> torch.Tensor:
        fused = getattr(mlp, FUSED_GATE_UP, None)
        if fused is None:
            return mlp(x)
        gate_up_codes, down_codes = codes
        if gate_up_codes is not None:
            gate_up = decode_linear(x, gate_up_codes)
        else:
            gate_up = torch.nn.functional.linear(x, fused)
        gate, up = gate_up.chunk(2, dim=-1)
        return cls._linear(mlp.down_proj, mlp.act_fn(gate) * up, down_splits, down_codes)
