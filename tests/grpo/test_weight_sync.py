"""Weight sync: one chunk plan for metadata and payload, bit-exact round trips, loud desyncs."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_gb10.grpo.weight_sync import (
    DEFAULT_KEEP_FP32,
    BucketMeta,
    TensorMeta,
    WeightBucket,
    WeightStream,
    WeightSyncError,
    plan_chunks,
    receive,
    receive_buckets,
    stream_names,
    transfer_dtype_for,
    unpack_bucket,
)


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in memory order (dtype-agnostic, so bf16 NaN payloads etc. compare too)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def mixed_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.gate.e_score_correction_bias": 40.0 + 1e-3 * torch.randn(8, generator=g),
        "model.position_ids": torch.arange(11, dtype=torch.int64).view(1, 11),
        "model.layers.0.norm.weight": torch.randn(9, generator=g).to(torch.float16),
        "model.layers.0.proj.weight": torch.randn(3, 4, generator=g),  # fp32 master weight
        "model.scalar": torch.tensor(2.5),
        "model.mask": torch.tensor([True, False, True]),
        "model.empty": torch.zeros(0, 4),
    }


def roundtrip(tensors: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
    stream = WeightStream(lambda: tensors.items(), **kwargs)
    return {name: t.clone() for name, t in receive(stream)}


# --- the plan --------------------------------------------------------------------------------


def test_transfer_dtype_rule():
    bf16 = torch.bfloat16
    assert transfer_dtype_for("a.weight", torch.float32, bf16, DEFAULT_KEEP_FP32) == bf16
    assert transfer_dtype_for("a.gate.e_score_correction_bias", torch.bfloat16, bf16, DEFAULT_KEEP_FP32) == (
        torch.float32
    )
    assert transfer_dtype_for("a.idx", torch.int64, bf16, DEFAULT_KEEP_FP32) == torch.int64
    assert transfer_dtype_for("a.weight", torch.float16, None, DEFAULT_KEEP_FP32) == torch.float16


def test_nvfp4_codes_travel_bit_exact_in_a_bf16_stream():
    """An NVFP4 weight as ModelOpt stores it: codes (uint8) and E4M3 block scales keep their bytes
    (a cast of the scales to BF16 would double their size), the FP32 weight_scale_2 stays FP32
    (BF16 would round it: 1/3 is not a BF16 number), and the rest goes BF16 as before."""
    bf16 = torch.bfloat16
    assert (
        transfer_dtype_for("a.weight_scale", torch.float8_e4m3fn, bf16, DEFAULT_KEEP_FP32)
        == torch.float8_e4m3fn
    )
    assert transfer_dtype_for("a.weight_scale_2", torch.float32, bf16, DEFAULT_KEEP_FP32) == torch.float32
    scale = (
        torch.arange(0, 126, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(6, 21)
    )  # every finite byte >= 0
    tensors = {
        "l.weight": torch.randint(0, 256, (6, 168), dtype=torch.uint8),
        "l.weight_scale": scale,
        "l.weight_scale_2": torch.tensor(1 / 3, dtype=torch.float32),
        "norm.weight": torch.randn(7),
    }
    out = roundtrip(tensors, bucket_bytes=256)
    for name in ("l.weight", "l.weight_scale", "l.weight_scale_2"):
        assert out[name].dtype == tensors[name].dtype and raw_bytes(out[name]) == raw_bytes(tensors[name]), (
            name
        )
    assert out["norm.weight"].dtype == bf16


def test_a_receiver_of_codes_refuses_rounded_scales():
    """8-bit float scales are bits, not numbers to round: check_metadata takes E4M3 only as E4M3
    (BF16 into an E4M3 buffer, or E4M3 into a BF16 one, is refused; other floats still cast)."""
    from slime_gb10.grpo.weight_sync import check_metadata

    named = [("s", torch.zeros(2, 4, dtype=torch.bfloat16)), ("w", torch.zeros(3, dtype=torch.float8_e4m3fn))]
    metadata = [meta for meta, _ in plan_chunks(named, bucket_bytes=1 << 20, transfer_dtype=None)]
    expected = {"s": ((2, 4), torch.float8_e4m3fn), "w": ((3,), torch.bfloat16)}
    with pytest.raises(WeightSyncError) as info:
        check_metadata(metadata, expected, receiver="engine")
    assert "'s': dtype bfloat16 streamed, float8_e4m3fn" in str(info.value)
    assert "'w': dtype float8_e4m3fn streamed, bfloat16" in str(info.value)
    check_metadata(
        metadata, {"s": ((2, 4), torch.float32), "w": ((3,), torch.float8_e4m3fn)}, receiver="engine"
    )


def test_plan_layout_alignment_and_buckets():
    tensors = mixed_tensors()
    metas = [meta for meta, _ in plan_chunks(tensors.items(), bucket_bytes=512, alignment=256)]
    assert stream_names(metas) == list(tensors)
    assert [m.index for m in metas] == list(range(len(metas)))
    by_name = {t.name: t for m in metas for t in m.tensors}
    for m in metas:
        assert m.nbytes == m.tensors[-1].offset + m.tensors[-1].nbytes
        assert m.nbytes <= 512 or len(m.tensors) == 1
        for t in m.tensors:
            assert t.offset % 256 == 0
    # embed: bf16 7*5*2 = 70 bytes at 0; bias: fp32 kept, 32 bytes at 256 -> bucket 0 = 288 bytes;
    # position_ids int64 88 bytes would end at 512+88 > 512 -> new bucket
    assert by_name["model.embed.weight"] == TensorMeta("model.embed.weight", "bfloat16", (7, 5), 0, 70)
    assert by_name["model.layers.0.mlp.gate.e_score_correction_bias"] == TensorMeta(
        "model.layers.0.mlp.gate.e_score_correction_bias", "float32", (8,), 256, 32
    )
    assert metas[0].nbytes == 288 and len(metas[0].tensors) == 2
    assert by_name["model.position_ids"] == TensorMeta("model.position_ids", "int64", (1, 11), 0, 88)
    assert by_name["model.layers.0.norm.weight"].dtype == "bfloat16"  # fp16 cast to the transfer dtype
    assert by_name["model.scalar"].shape == () and by_name["model.scalar"].nbytes == 2
    assert by_name["model.mask"].dtype == "bool"
    assert by_name["model.empty"].nbytes == 0


def test_tensor_bigger_than_bucket_gets_own_bucket():
    tensors = {
        "a": torch.ones(10, dtype=torch.bfloat16),  # 20 bytes
        "big": torch.ones(1000, dtype=torch.bfloat16),  # 2000 bytes > bucket
        "b": torch.ones(10, dtype=torch.bfloat16),
    }
    metas = [m for m, _ in plan_chunks(tensors.items(), bucket_bytes=1024)]
    assert [m.names for m in metas] == [["a"], ["big"], ["b"]]
    assert metas[1].nbytes == 2000
    out = roundtrip(tensors, bucket_bytes=1024)
    assert all(raw_bytes(out[k]) == raw_bytes(v) for k, v in tensors.items())


def test_plan_is_lazy_holds_one_bucket():
    pulled = []

    def gen():
        for i in range(10):
            pulled.append(i)
            yield f"t{i}", torch.ones(100, dtype=torch.bfloat16)  # 200 bytes, aligned to 256

    plan = plan_chunks(gen(), bucket_bytes=600)  # 2 tensors per bucket (0..200, 256..456; next ends 712)
    meta, tensors = next(plan)
    assert meta.names == ["t0", "t1"] and len(tensors) == 2
    assert pulled == [0, 1, 2]  # only one tensor past the bucket was read


def test_plan_errors():
    with pytest.raises(WeightSyncError, match="'w' appears twice"):
        list(plan_chunks([("w", torch.ones(1)), ("w", torch.ones(1))], bucket_bytes=64))
    with pytest.raises(ValueError):
        list(plan_chunks([], bucket_bytes=0))
    with pytest.raises(ValueError):
        list(plan_chunks([], bucket_bytes=64, alignment=3))


# --- round trips -----------------------------------------------------------------------------


def test_roundtrip_bit_exact_mixed_dtypes_native():
    # transfer_dtype=None: every tensor travels in its own dtype -> bytes identical; one bucket
    # holds bf16 + fp32 (keep rule) + int64 + fp16 + fp32 + bool
    tensors = mixed_tensors()
    stream = WeightStream(lambda: tensors.items(), bucket_bytes=1 << 20, transfer_dtype=None)
    assert len(stream) == 1
    assert {t.dtype for t in stream.metadata[0].tensors} >= {
        "bfloat16",
        "float32",
        "int64",
        "float16",
        "bool",
    }
    out = {n: t.clone() for n, t in receive(stream)}
    assert list(out) == list(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape, name
        assert raw_bytes(out[name]) == raw_bytes(t), name


def test_roundtrip_bf16_transfer_and_keep_fp32():
    tensors = mixed_tensors()
    bias_name = "model.layers.0.mlp.gate.e_score_correction_bias"
    bias = tensors[bias_name]
    # sanity: BF16 would destroy the per-expert offsets (ulp of bf16 at 40 is 0.25)
    assert not torch.equal(bias.to(torch.bfloat16).float(), bias)
    out = roundtrip(tensors, bucket_bytes=300)
    assert out[bias_name].dtype == torch.float32
    assert raw_bytes(out[bias_name]) == raw_bytes(bias)  # exactly preserved
    for name, t in tensors.items():
        if name == bias_name:
            continue
        expected = t.to(torch.bfloat16) if t.dtype.is_floating_point else t
        assert out[name].dtype == expected.dtype, name
        assert raw_bytes(out[name]) == raw_bytes(expected), name


def test_empty_model():
    stream = WeightStream(lambda: iter(()), bucket_bytes=1024)
    assert stream.metadata == [] and stream.total_bytes == 0
    assert list(receive(stream)) == []


def test_real_moe_model_roundtrip():
    """A real transformers DeepSeek-V3 (tiny config) whose router carries ``e_score_correction_bias``."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    trainer_model = transformers.DeepseekV3ForCausalLM(cfg)  # fp32 master weights
    bias_name = "model.layers.1.mlp.gate.e_score_correction_bias"
    with torch.no_grad():
        trainer_model.get_buffer(bias_name).copy_(30.0 + 1e-3 * torch.randn(4))
    # the engine runs in bf16 but keeps the router bias in fp32 (as SGLang/vLLM do for this buffer)
    engine_model = transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    gate = engine_model.get_submodule("model.layers.1.mlp.gate")
    gate.e_score_correction_bias = gate.e_score_correction_bias.float()
    targets = dict(engine_model.named_parameters()) | dict(engine_model.named_buffers())

    stream = WeightStream(lambda: trainer_model.state_dict().items(), bucket_bytes=4096)
    assert len(stream) > 3  # several buckets
    received = set()
    with torch.no_grad():
        for name, tensor in receive(stream):
            targets[name].copy_(tensor)
            received.add(name)
    assert received == set(trainer_model.state_dict())
    src = trainer_model.state_dict()
    dst = engine_model.state_dict()
    for name, t in src.items():
        if name == bias_name:
            assert dst[name].dtype == torch.float32 and torch.equal(dst[name], t)
        else:
            assert torch.equal(dst[name], t.to(torch.bfloat16)), name


def test_metadata_and_buckets_pickle():
    # the metadata and buckets cross process boundaries (rollout engine workers)
    tensors = mixed_tensors()
    stream = WeightStream(lambda: tensors.items(), bucket_bytes=256)
    metadata = pickle.loads(pickle.dumps(stream.metadata))
    buckets = [pickle.loads(pickle.dumps(b)) for b in stream]
    out = dict(receive((metadata, buckets)))
    assert raw_bytes(out["model.position_ids"]) == raw_bytes(tensors["model.position_ids"])


def test_stream_can_be_iterated_twice_and_holds_no_payload():
    tensors = mixed_tensors()
    stream = WeightStream(lambda: tensors.items(), bucket_bytes=256)
    first = [raw_bytes(b.payload) for b in stream]
    second = [raw_bytes(b.payload) for b in stream]
    assert first == second
    assert stream.total_bytes == sum(len(p) for p in first)
    assert not any(isinstance(v, torch.Tensor) for v in vars(stream).values())


# --- desync detection ------------------------------------------------------------------------


def _stream_parts(bucket_bytes=256):
    tensors = mixed_tensors()
    stream = WeightStream(lambda: tensors.items(), bucket_bytes=bucket_bytes)
    return list(stream.metadata), list(stream)


def test_dropped_bucket_names_first_missing():
    metadata, buckets = _stream_parts()
    names = stream_names(metadata)
    dropped = buckets[:2] + buckets[3:]  # bucket 3 arrives where bucket 2 is expected
    with pytest.raises(WeightSyncError, match=r"bucket 2 .*first mismatch at stream position"):
        list(receive((metadata, dropped)))
    truncated = buckets[:-1]
    missing = metadata[-1].tensors[0].name
    n_streamed = len(names) - len(metadata[-1].tensors)
    with pytest.raises(
        WeightSyncError,
        match=rf"streamed {n_streamed} tensors, metadata lists {len(names)}; first mismatch at position "
        rf"{n_streamed}: metadata '{missing}' never streamed",
    ):
        list(receive((metadata, truncated)))


def test_receive_buckets_keeps_the_plan_s_buckets_and_checks_like_receive():
    metadata, buckets = _stream_parts()
    got = list(receive_buckets((metadata, buckets)))
    assert [[name for name, _ in bucket] for bucket in got] == [list(meta.names) for meta in metadata]
    flat = list(receive((metadata, buckets)))
    assert [name for name, _ in flat] == [name for bucket in got for name, _ in bucket]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(flat, [t for bucket in got for t in bucket]))
    with pytest.raises(WeightSyncError, match=r"bucket 2 .*first mismatch at stream position"):
        list(receive_buckets((metadata, buckets[:2] + buckets[3:])))


def test_renamed_tensor_is_named():
    metadata, buckets = _stream_parts()
    b = buckets[1]
    first = b.meta.tensors[0]
    renamed = dataclasses.replace(
        b.meta, tensors=(dataclasses.replace(first, name="model.WRONG"), *b.meta.tensors[1:])
    )
    buckets[1] = WeightBucket(renamed, b.payload)
    position = len(metadata[0].tensors)
    with pytest.raises(
        WeightSyncError, match=rf"stream position {position}: got 'model.WRONG', metadata '{first.name}'"
    ):
        list(receive((metadata, buckets)))


def test_reordered_buckets_and_extra_bucket():
    metadata, buckets = _stream_parts()
    swapped = [buckets[1], buckets[0], *buckets[2:]]
    with pytest.raises(WeightSyncError, match="stream position 0"):
        list(receive((metadata, swapped)))
    with pytest.raises(WeightSyncError, match="arrived but the metadata announces"):
        list(receive((metadata, [*buckets, buckets[-1]])))


def test_dropped_tensor_inside_bucket_and_bad_layout():
    metadata, buckets = _stream_parts(bucket_bytes=1 << 20)
    b = buckets[0]
    fewer = dataclasses.replace(b.meta, tensors=b.meta.tensors[:2] + b.meta.tensors[3:])
    third = b.meta.tensors[2].name
    with pytest.raises(
        WeightSyncError, match=rf"stream position 2: got '{b.meta.tensors[3].name}', metadata '{third}'"
    ):
        list(receive((metadata, [WeightBucket(fewer, b.payload)])))
    # same names, different dtype: layout mismatch is reported too
    t0 = b.meta.tensors[0]
    retyped = dataclasses.replace(
        b.meta, tensors=(dataclasses.replace(t0, dtype="float16"), *b.meta.tensors[1:])
    )
    with pytest.raises(WeightSyncError, match="the metadata says"):
        list(receive((metadata, [WeightBucket(retyped, b.payload)])))


def test_receiver_yields_nothing_of_a_bad_bucket():
    metadata, buckets = _stream_parts()
    bad = [buckets[0], buckets[2]]
    got = []
    with pytest.raises(WeightSyncError):
        for name, _ in receive((metadata, bad)):
            got.append(name)
    assert got == metadata[0].names


def test_unpack_errors():
    meta = BucketMeta(0, 8, (TensorMeta("x", "float32", (2,), 0, 8),))
    with pytest.raises(WeightSyncError, match="payload has 4 bytes"):
        unpack_bucket(WeightBucket(meta, torch.zeros(4, dtype=torch.uint8)))
    with pytest.raises(WeightSyncError, match="flat uint8"):
        unpack_bucket(WeightBucket(meta, torch.zeros(2)))
    weird = BucketMeta(0, 8, (TensorMeta("x", "float99", (2,), 0, 8),))
    with pytest.raises(WeightSyncError, match="unknown dtype 'float99'"):
        unpack_bucket(WeightBucket(weird, torch.zeros(8, dtype=torch.uint8)))
    assert unpack_bucket(WeightBucket(meta, torch.zeros(8, dtype=torch.uint8)))[0][1].tolist() == [0.0, 0.0]


def _drifting(second_run):
    calls = {"n": 0}
    base = mixed_tensors()

    def named_tensors():
        calls["n"] += 1
        return base.items() if calls["n"] == 1 else second_run(dict(base)).items()

    return named_tensors


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: {**d, "model.scalar": torch.zeros(2)},
            r"tensor 'model\.scalar' is .* but the metadata says",
        ),
        (lambda d: dict(reversed(list(d.items()))), "first mismatch at stream position 0"),
        (
            lambda d: {k: v for k, v in d.items() if k != "model.position_ids"},
            "got 'model.layers.0.norm.weight'",
        ),
        (lambda d: {**d, "model.extra": torch.ones(3)}, "beyond the"),
        (lambda d: dict(list(d.items())[:2]), "first missing: bucket"),
    ],
    ids=["shape", "reorder", "drop", "extra", "truncate"],
)
def test_drift_between_metadata_and_payload_is_loud(mutate, message):
    stream = WeightStream(_drifting(mutate), bucket_bytes=256)
    with pytest.raises(
        WeightSyncError, match="changed between the metadata pass and the payload pass"
    ) as info:
        list(receive(stream))
    assert info.match(message)


# --- properties ------------------------------------------------------------------------------


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=3)),
        min_size=0,
        max_size=12,
    ),
    st.integers(1, 300),
    st.sampled_from([1, 8, 256]),
    st.booleans(),
)
def test_random_models_roundtrip(specs, bucket_bytes, alignment, native):
    g = torch.Generator().manual_seed(len(specs) * 1000 + bucket_bytes)
    tensors = {}
    for i, (dtype, shape) in enumerate(specs):
        if dtype == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        elif dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
        else:
            t = torch.randint(0, 100, shape, generator=g).to(dtype)
        tensors[f"layer.{i}.w"] = t
    stream = WeightStream(
        lambda: tensors.items(), bucket_bytes=bucket_bytes, transfer_dtype=None if native else torch.bfloat16
    )
    # alignment is a plan parameter; check the plan with the requested alignment too
    for meta, _ in plan_chunks(tensors.items(), bucket_bytes=bucket_bytes, alignment=alignment):
        assert all(t.offset % alignment == 0 for t in meta.tensors)
        assert meta.nbytes <= bucket_bytes or len(meta.tensors) == 1
    out = {n: t.clone() for n, t in receive(stream)}
    assert list(out) == list(tensors)
    for name, t in tensors.items():
        expected = t if native or not t.dtype.is_floating_point else t.to(torch.bfloat16)
        assert out[name].shape == t.shape
        assert raw_bytes(out[name]) == raw_bytes(expected)


@pytest.mark.gpu
def test_cuda_payload_stays_on_source_device_and_unpacks_anywhere():
    tensors = {k: v.cuda() for k, v in mixed_tensors().items()}
    stream = WeightStream(lambda: tensors.items(), bucket_bytes=256)
    buckets = list(stream)
    assert all(b.payload.device.type == "cuda" for b in buckets)
    on_cpu = dict(receive((stream.metadata, buckets), device="cpu"))
    bias = "model.layers.0.mlp.gate.e_score_correction_bias"
    assert on_cpu[bias].device.type == "cpu"
    assert raw_bytes(on_cpu[bias]) == raw_bytes(tensors[bias].cpu())
    on_gpu = dict(receive(stream))
    assert raw_bytes(on_gpu["model.embed.weight"].cpu()) == raw_bytes(tensors["model.embed.weight"].cpu())


def test_check_metadata_collects_every_problem_in_one_error():
    from slime_gb10.grpo.weight_sync import check_metadata

    named = [("a", torch.zeros(2, 3)), ("b", torch.zeros(4)), ("c", torch.zeros(1, dtype=torch.int64))]
    metadata = [meta for meta, _ in plan_chunks(named, bucket_bytes=1 << 20, transfer_dtype=None)]
    expected = {"a": ((2, 3), torch.float32), "b": ((5,), None), "c": ((1,), torch.int32), "d": ((1,), None)}
    with pytest.raises(WeightSyncError) as info:
        check_metadata(metadata, expected, receiver="engine")
    text = str(info.value)
    assert "'b': shape (4,) streamed, (5,) in the engine" in text
    assert "'c': dtype int64 streamed, int32 in the engine" in text
    assert "1 tensor(s) of the engine are not streamed, e.g. ['d']" in text
    check_metadata(metadata, {**expected, "b": ((4,), None), "c": ((1,), torch.int64)}, receiver="engine",
                   optional=("d",))  # fmt: skip


def test_sglang_expects_the_checkpoint_tensors(tmp_path, tokenizer):
    """The SGLang engine's coverage check reads the model's safetensors headers (no load)."""
    from slime_gb10.grpo.models import checkpoint_tensor_shapes, load_causal_lm, write_random_model

    path = write_random_model(tmp_path / "m", tokenizer, seed=0)
    model = load_causal_lm(str(path))
    shapes = checkpoint_tensor_shapes(path)
    assert shapes == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert checkpoint_tensor_shapes(tmp_path / "nothing") is None


def test_a_metadata_pass_of_meta_tensors_plans_the_same_buckets_and_is_held_to_them():
    """``metadata_fn`` (names, shapes and dtypes only, e.g. ``meta`` tensors) plans the buckets; the
    payload pass is checked against that plan, so a describer that lies fails the sync."""
    tensors = {f"w{i}": torch.randn(4, 8) for i in range(5)}
    honest = WeightStream(
        lambda: tensors.items(),
        bucket_bytes=200,
        metadata_fn=lambda: (
            (n, torch.empty(t.shape, dtype=t.dtype, device="meta")) for n, t in tensors.items()
        ),
    )
    plain = WeightStream(lambda: tensors.items(), bucket_bytes=200)
    assert honest.metadata == plain.metadata and len(list(honest)) == len(plain.metadata)
    lying = WeightStream(
        lambda: tensors.items(),
        bucket_bytes=200,
        metadata_fn=lambda: ((n, torch.empty(8, 4, device="meta")) for n in tensors),
    )
    with pytest.raises(WeightSyncError, match="changed between the metadata pass and the payload pass"):
        list(lying)
