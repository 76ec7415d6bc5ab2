"""Contract tests of the SGLang adapter against the pinned SGLang's own source code.

SGLang's runtime cannot run here (it needs CUDA and sgl-kernel), so nothing of it is imported:
the installed package's files (``pip install --no-deps sglang==<pin>``: SGLang's Python files
only) are parsed with ``ast``, and every name the adapter lists in its module-level constants
must exist there with that name. The adapter's pure mappings (sampling parameters, output
parsing, bucket grouping) are tested against hand-written SGLang-shaped data; the engine
lifecycle is tested against a recording stand-in for ``Engine``, because a real one needs a GPU
(tests/grpo/test_sglang_gpu.py runs the real one on a GB10).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SPEC = importlib.util.find_spec("sglang")
pytestmark = pytest.mark.skipif(
    SPEC is None,
    reason="sglang is not installed; CI installs the pinned sources with: pip install --no-deps sglang==0.5.12.post1",
)

if SPEC is not None:
    from slime_gb10.grpo.engines import sglang_engine as adapter
    from slime_gb10.grpo.interfaces import SamplingParams

    SGLANG_ROOT = Path(next(iter(SPEC.submodule_search_locations)))


def _parse(relative: str) -> ast.Module:
    path = SGLANG_ROOT / relative
    assert path.is_file(), f"{path} is missing from the installed sglang: the layout changed"
    return ast.parse(path.read_text(encoding="utf-8"))


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _param_names(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def _string_constants(module: ast.Module) -> set[str]:
    return {n.value for n in ast.walk(module) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _dict_keys(module: ast.Module) -> set[str]:
    keys = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        stored = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
        if stored and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            keys.add(node.slice.value)
    return keys


def test_installed_sglang_is_the_pinned_version():
    import importlib.metadata

    version = importlib.metadata.version("sglang")  # the wheel's metadata: nothing of sglang runs
    assert version == adapter.SGLANG_PIN, (
        f"installed sglang is {version}, the adapter is checked against {adapter.SGLANG_PIN}: "
        f"pip install --no-deps sglang=={adapter.SGLANG_PIN}"
    )


def test_engine_class_exists_where_the_adapter_imports_it():
    module = _parse(adapter.SGLANG_ENGINE_MODULE.removeprefix("sglang.").replace(".", "/") + ".py")
    _class(module, adapter.SGLANG_ENGINE_CLASS)


def test_engine_init_kwargs_are_server_args_fields():
    engine = _class(_parse("srt/entrypoints/engine.py"), "Engine")
    init = _methods(engine)["__init__"]
    assert init.args.kwarg is not None, "Engine.__init__ no longer takes **kwargs (ServerArgs fields)"
    server_args = _class(_parse("srt/server_args.py"), "ServerArgs")
    fields = {
        n.target.id
        for n in server_args.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    missing = sorted(set(adapter.ENGINE_INIT_KWARGS) - fields)
    assert not missing, f"ServerArgs has no field(s) {missing}"


@pytest.mark.parametrize("method", sorted(adapter.ENGINE_METHOD_KWARGS) if SPEC else [])
def test_engine_methods_take_the_keywords_the_adapter_passes(method):
    methods = _methods(_class(_parse("srt/entrypoints/engine.py"), "Engine"))
    assert method in methods, f"Engine.{method} does not exist in sglang {adapter.SGLANG_PIN}"
    fn = methods[method]
    missing = sorted(set(adapter.ENGINE_METHOD_KWARGS[method]) - _param_names(fn))
    assert not missing, f"Engine.{method} has no parameter(s) {missing}"
    assert not isinstance(fn, ast.AsyncFunctionDef), (
        f"Engine.{method} is async; the adapter calls it synchronously"
    )


def test_sampling_param_keys_are_sampling_params_arguments():
    init = _methods(_class(_parse("srt/sampling/sampling_params.py"), "SamplingParams"))["__init__"]
    missing = sorted(set(adapter.SAMPLING_PARAM_KEYS) - _param_names(init))
    assert not missing, f"SamplingParams.__init__ has no argument(s) {missing}"


def test_output_and_meta_info_keys_are_produced_by_the_tokenizer_manager():
    keys = _dict_keys(_parse("srt/managers/tokenizer_manager.py"))
    missing = sorted((set(adapter.OUTPUT_KEYS) | set(adapter.META_INFO_KEYS)) - keys)
    assert not missing, f"tokenizer_manager.py never writes the output key(s) {missing}"


def test_finish_reason_types():
    module = _parse("srt/managers/schedule_batch.py")
    types = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "type" and isinstance(v, ast.Constant):
                    types.add(v.value)
    assert set(adapter.FINISH_TYPES) <= types, types


def test_memory_tags_are_sglangs_gpu_memory_types():
    module = _parse("srt/constants.py")
    values = {
        n.value.value
        for n in module.body
        if isinstance(n, ast.Assign)
        and any(getattr(t, "id", "").startswith("GPU_MEMORY_TYPE_") for t in n.targets)
        and isinstance(n.value, ast.Constant)
    }
    assert set(adapter.MEMORY_TAGS) == values


def test_update_weights_from_tensor_serialises_named_tensors_for_tp_workers():
    # The adapter hands over (name, CUDA tensor) lists; the engine must serialise them itself
    # (MultiprocessingSerializer) unless load_format == "flattened_bucket", which we never use.
    fn = _methods(_class(_parse("srt/entrypoints/engine.py"), "Engine"))["update_weights_from_tensor"]
    source = ast.unparse(fn)
    assert "MultiprocessingSerializer.serialize(named_tensors)" in source
    assert "flattened_bucket" in source


def test_logprob_convention_switch_exists():
    # Default SGLang logprobs are log softmax(logits / T); this env var (sglang/srt/environ.py,
    # an Envs class attribute) would switch them to the pre-temperature distribution.
    envs = _class(_parse("srt/environ.py"), "Envs")
    names = {
        n.targets[0].id for n in envs.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }
    assert adapter.RETURN_ORIGINAL_LOGPROB_ENV in names


# ---------------------------------------------------------------- the adapter's pure mappings


def test_sampling_params_map_one_to_one():
    params = SamplingParams(
        max_new_tokens=17, temperature=0.7, top_p=0.9, top_k=20, stop=("\n\n", "###"), seed=5
    )
    d0 = adapter.sampling_params_dict(params, [2, 0, 2], 0)
    d3 = adapter.sampling_params_dict(params, [2, 0, 2], 3)
    assert d0 == {
        "max_new_tokens": 17,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["\n\n", "###"],
        "stop_token_ids": [0, 2],
        "no_stop_trim": True,
        "skip_special_tokens": True,
        "sampling_seed": 5,
    }
    assert d3["sampling_seed"] == 8  # one seed per request: G samples of a prompt must differ
    plain = adapter.sampling_params_dict(SamplingParams(temperature=0.0), [], 0)
    assert "stop" not in plain and "sampling_seed" not in plain and "stop_token_ids" not in plain
    assert plain["temperature"] == 0.0


def _sglang_output(tokens, logprobs, finish, text="x"):
    # Shape of one Engine.generate result (tokenizer_manager.py): output_token_logprobs entries
    # are (logprob, token_id, token_text or None).
    return {
        "text": text,
        "output_ids": list(tokens),
        "meta_info": {
            "finish_reason": finish,
            "completion_tokens": len(tokens),
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(logprobs, tokens)],
        },
    }


def test_generation_from_output_aligns_ids_and_logprobs():
    out = _sglang_output([5, 9, 2], [-0.5, -1.25, -0.125], {"type": "stop", "matched": 2}, text="a b")
    g = adapter.generation_from_output([1, 2, 3], out)
    assert (g.prompt_ids, g.completion_ids, g.completion_logprobs) == (
        [1, 2, 3],
        [5, 9, 2],
        [-0.5, -1.25, -0.125],
    )
    assert (g.text, g.finish_reason) == ("a b", "stop")
    g = adapter.generation_from_output(
        [1], _sglang_output([7, 7], [-1.0, -2.0], {"type": "length", "length": 2})
    )
    assert g.finish_reason == "length" and g.truncated


def test_generation_from_output_refuses_inconsistent_or_aborted_outputs():
    bad = _sglang_output([5, 9], [-0.5, -1.0], {"type": "stop", "matched": 9})
    bad["output_ids"] = [5, 8]
    with pytest.raises(adapter.SGLangEngineError, match="disagree"):
        adapter.generation_from_output([1], bad)
    with pytest.raises(adapter.SGLangEngineError, match=r"aborted.*out of memory"):
        adapter.generation_from_output(
            [1], _sglang_output([], [], {"type": "abort", "message": "out of memory"})
        )
    no_lp = _sglang_output([5], [-0.5], {"type": "stop"})
    del no_lp["meta_info"]["output_token_logprobs"]
    with pytest.raises(adapter.SGLangEngineError, match="return_logprob"):
        adapter.generation_from_output([1], no_lp)


class _Cfg:
    mem_fraction_static = None
    attention_backend = "auto"
    sampling_backend = "auto"
    enable_memory_saver = True
    disable_cuda_graph = False
    log_level = "error"


def test_engine_kwargs_for_gb10_and_for_a_discrete_gpu():
    gb10 = adapter.engine_kwargs(
        _Cfg(), "/m", seed=3, device_index=0, compute_capability=(12, 1), unified_memory=True
    )
    assert gb10["mem_fraction_static"] == 0.7
    assert gb10["attention_backend"] == "triton" and gb10["sampling_backend"] == "pytorch"
    assert gb10["enable_memory_saver"] is True and gb10["random_seed"] == 3 and gb10["dtype"] == "bfloat16"
    h100 = adapter.engine_kwargs(
        _Cfg(), "/m", seed=0, device_index=1, compute_capability=(9, 0), unified_memory=False
    )
    assert h100["mem_fraction_static"] == 0.8 and "attention_backend" not in h100 and h100["base_gpu_id"] == 1
    assert set(gb10) <= set(adapter.ENGINE_INIT_KWARGS)


# ---------------------------------------------------------------- lifecycle against a recording stand-in


class RecordingEngine:
    """Stand-in for sglang's Engine (a real one needs a CUDA GPU and sgl-kernel).

    Its methods have the pinned Engine's parameter names (checked above), record each call and
    copy received weights into a dict so the test can compare them with the trainer's.
    """

    def __init__(self, child_pids=()):
        self.calls: list[tuple[str, dict]] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.child_pids = list(child_pids)

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(
            ("update_weights_from_tensor", {"n": len(named_tensors), "flush_cache": flush_cache})
        )
        for name, tensor in named_tensors:
            self.weights[name] = tensor.clone()
        return True, "Succeeded to update model weights."

    def flush_cache(self):
        self.calls.append(("flush_cache", {}))

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release_memory_occupation", {"tags": tags}))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume_memory_occupation", {"tags": tags}))

    def get_all_child_pids(self):
        return self.child_pids

    def shutdown(self):
        self.calls.append(("shutdown", {}))


def test_update_weights_feeds_one_bucket_per_call_then_flushes():
    from slime_gb10.grpo.weight_sync import WeightStream

    torch.manual_seed(0)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(64, 32) for i in range(5)}
    stream = WeightStream(
        lambda: iter(tensors.items()), bucket_bytes=2 * 64 * 32 * 2, transfer_dtype=torch.bfloat16
    )
    assert len(stream.metadata) == 3  # 2 + 2 + 1 tensors of 4 KiB in BF16
    fake = RecordingEngine()
    engine = adapter.SGLangRolloutEngine(
        fake, stop_token_ids=[2], memory_saver=True, device=torch.device("cpu")
    )
    engine.update_weights(stream)
    assert [c[0] for c in fake.calls] == ["update_weights_from_tensor"] * 3 + ["flush_cache"]
    assert [c[1]["n"] for c in fake.calls[:3]] == [2, 2, 1]
    assert all(c[1]["flush_cache"] is False for c in fake.calls[:3])  # one flush at the end
    for name, t in tensors.items():
        assert torch.equal(fake.weights[name], t.to(torch.bfloat16))


def test_sleep_wake_and_weight_update_order():
    from slime_gb10.grpo.weight_sync import WeightStream

    fake = RecordingEngine()
    engine = adapter.SGLangRolloutEngine(
        fake, stop_token_ids=[], memory_saver=True, device=torch.device("cpu")
    )
    engine.sleep()
    engine.update_weights(WeightStream(lambda: iter([("w", torch.ones(4))]), bucket_bytes=1 << 20))
    engine.wake()
    names = [(c[0], c[1].get("tags")) for c in fake.calls if "memory" in c[0]]
    assert names == [
        ("release_memory_occupation", ["kv_cache", "weights", "cuda_graph"]),
        ("resume_memory_occupation", ["weights"]),  # weights come back before they are overwritten
        ("resume_memory_occupation", ["kv_cache", "cuda_graph"]),
    ]
    engine.wake()  # nothing released: no call
    assert len([c for c in fake.calls if "memory" in c[0]]) == 3
    off = RecordingEngine()
    adapter.SGLangRolloutEngine(
        off, stop_token_ids=[], memory_saver=False, device=torch.device("cpu")
    ).sleep()
    assert off.calls == []


def test_health_check_names_dead_subprocesses():
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        ok = adapter.SGLangRolloutEngine(
            RecordingEngine([alive.pid]), stop_token_ids=[], memory_saver=False, device=torch.device("cpu")
        )
        ok.health_check()
        broken = adapter.SGLangRolloutEngine(
            RecordingEngine([alive.pid, dead.pid]),
            stop_token_ids=[],
            memory_saver=False,
            device=torch.device("cpu"),
        )
        with pytest.raises(adapter.SGLangEngineError, match=rf"\[{dead.pid}\].*died.*mem_fraction_static"):
            broken.health_check()
        broken.shutdown()
        with pytest.raises(adapter.SGLangEngineError, match="shut down"):
            broken.health_check()
    finally:
        alive.kill()
        alive.wait()
