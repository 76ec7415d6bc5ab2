"""The production rollout engine: SGLang's offline in-process ``Engine``, colocated with the trainer.

On a GB10 (sm_121a, 128 GB of memory shared by CPU and GPU) slime runs SGLang and the trainer on
the same GPU. This adapter maps the trainer's :class:`~slime_gb10.grpo.interfaces.RolloutEngine`
onto ``sglang.srt.entrypoints.engine.Engine``:

* startup: ``mem_fraction_static`` ≤ 0.7 on unified memory (the CPU side, the trainer and the
  CUDA context live in the same 128 GB), Triton attention on sm_12x (FlashAttention 3 is
  sm_90-only; FA4 targets sm_100), SGLang's memory saver so the KV cache, weights and CUDA graphs
  can be released while the trainer runs;
* ``generate``: prompts go in as token ids; sampling parameters map 1:1 onto SGLang's
  (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop``; ``no_stop_trim`` keeps
  the stop string in the text, as the PyTorch engine does); per-token logprobs come back from
  ``meta_info["output_token_logprobs"]``. SGLang's default logprob is ``log softmax(logits / T)``
  before top-p/top-k (``SGLANG_RETURN_ORIGINAL_LOGPROB`` unset), the trainer's convention;
* ``sleep``/``wake``: ``release_memory_occupation`` / ``resume_memory_occupation``;
* ``update_weights``: the trainer's chunk stream (:mod:`slime_gb10.grpo.weight_sync`) is fed to
  ``update_weights_from_tensor`` one bucket at a time (peak extra memory: one bucket), then the
  prefix (radix) cache is flushed, since cached KV was computed with the old weights;
* ``health_check``: every SGLang subprocess (scheduler, detokenizer) must be alive.

Every SGLang name this module uses is listed once below (``ENGINE_INIT_KWARGS`` ...);
``tests/grpo/test_sglang_contract.py`` checks each against the pinned SGLang's source code
without importing SGLang's runtime (which needs CUDA and sgl-kernel).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from slime_gb10.grpo.interfaces import Generation, RolloutEngine, SamplingParams

if importlib.util.find_spec("sglang") is None:
    raise ImportError("SGLang is not installed: pip install 'slime-gb10[sglang]' (or use rollout: torch)")

log = logging.getLogger(__name__)

# The SGLang release these names were checked against (nixpkgs' python3Packages.sglang).
SGLANG_PIN = "0.5.12.post1"
SGLANG_ENGINE_MODULE = "sglang.srt.entrypoints.engine"
SGLANG_ENGINE_CLASS = "Engine"

# ---- every SGLang name the adapter uses (the contract test checks exactly these) ----
# Engine(**kwargs) forwards kwargs to ServerArgs (sglang/srt/server_args.py): these are fields there.
ENGINE_INIT_KWARGS = (
    "model_path",
    "tokenizer_path",
    "dtype",
    "mem_fraction_static",
    "attention_backend",
    "sampling_backend",
    "enable_memory_saver",
    "disable_cuda_graph",
    "random_seed",
    "base_gpu_id",
    "log_level",
    "trust_remote_code",
)
# Engine methods and the keyword arguments we pass to each.
ENGINE_METHOD_KWARGS: dict[str, tuple[str, ...]] = {
    "generate": ("input_ids", "sampling_params", "return_logprob"),
    "update_weights_from_tensor": ("named_tensors", "load_format", "flush_cache"),
    "flush_cache": (),
    "release_memory_occupation": ("tags",),
    "resume_memory_occupation": ("tags",),
    "get_all_child_pids": (),
    "shutdown": (),
}
# Keys of the per-request sampling_params dict: SamplingParams.__init__ arguments
# (sglang/srt/sampling/sampling_params.py).
SAMPLING_PARAM_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_regex",
    "stop_token_ids",
    "no_stop_trim",
    "skip_special_tokens",
    "sampling_seed",
)
# Keys of one generate() output dict and of its meta_info (sglang/srt/managers/tokenizer_manager.py).
OUTPUT_KEYS = ("text", "output_ids", "meta_info")
META_INFO_KEYS = ("output_token_logprobs", "finish_reason", "completion_tokens")
# finish_reason["type"] values (sglang/srt/managers/schedule_batch.py, BaseFinishReason.to_json).
FINISH_TYPES = ("stop", "length", "abort")
# Memory tags of release/resume_memory_occupation (sglang/srt/constants.py, GPU_MEMORY_TYPE_*).
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
# Environment variable that would switch SGLang's logprobs to the pre-temperature distribution.
RETURN_ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"

UNIFIED_MEMORY_MEM_FRACTION = 0.7  # GB10: slime's setting on unified memory
DISCRETE_GPU_MEM_FRACTION = 0.8  # colocated with the trainer on a discrete GPU


class SGLangEngineError(RuntimeError):
    """The SGLang engine failed or died; the message says what to check."""


# ---------------------------------------------------------------- pure mappings (tested on CPU)


def is_unified_memory_gpu(device_index: int = 0) -> bool:
    """GB10 (sm_121, integrated): the GPU shares the 128 GB LPDDR5x with the CPU."""
    from slime_gb10.platform.devices import is_unified_memory

    if not torch.cuda.is_available():
        return False
    props = torch.cuda.get_device_properties(device_index)
    return is_unified_memory((props.major, props.minor), getattr(props, "is_integrated", False))


def default_attention_backend(compute_capability: tuple[int, int] | None) -> str | None:
    """Triton attention on sm_12x (no FlashAttention 3 there); ``None`` lets SGLang choose elsewhere."""
    from slime_gb10.platform.devices import is_sm12x

    if is_sm12x(compute_capability):
        return "triton"
    return None


def default_sampling_backend(compute_capability: tuple[int, int] | None) -> str | None:
    """PyTorch sampling on sm_12x (no FlashInfer JIT needed); ``None`` lets SGLang choose elsewhere."""
    from slime_gb10.platform.devices import is_sm12x

    if is_sm12x(compute_capability):
        return "pytorch"
    return None


def engine_kwargs(
    sglang_config: Any,
    model_path: str,
    *,
    seed: int,
    device_index: int,
    compute_capability: tuple[int, int] | None,
    unified_memory: bool,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """``Engine(**kwargs)`` for the trainer's ``sglang`` config section."""
    mem = getattr(sglang_config, "mem_fraction_static", None)
    if mem is None:
        mem = UNIFIED_MEMORY_MEM_FRACTION if unified_memory else DISCRETE_GPU_MEM_FRACTION
    elif unified_memory and mem > UNIFIED_MEMORY_MEM_FRACTION:
        log.warning(
            "sglang.mem_fraction_static=%.2f on unified memory: above %.1f the CPU side and the trainer can "
            "run out of the shared memory",
            mem,
            UNIFIED_MEMORY_MEM_FRACTION,
        )
    attention = getattr(sglang_config, "attention_backend", "auto")
    if attention in (None, "auto"):
        attention = default_attention_backend(compute_capability)
    sampling = getattr(sglang_config, "sampling_backend", "auto")
    if sampling in (None, "auto"):
        sampling = default_sampling_backend(compute_capability)
    kwargs = {
        "model_path": model_path,
        "tokenizer_path": model_path,
        "dtype": "bfloat16",
        "mem_fraction_static": float(mem),
        "attention_backend": attention,
        "sampling_backend": sampling,
        "enable_memory_saver": bool(getattr(sglang_config, "enable_memory_saver", True)),
        "disable_cuda_graph": bool(getattr(sglang_config, "disable_cuda_graph", False)),
        "random_seed": int(seed),
        "base_gpu_id": int(device_index),
        "log_level": getattr(sglang_config, "log_level", "error"),
        "trust_remote_code": bool(trust_remote_code),
    }
    assert set(kwargs) == set(ENGINE_INIT_KWARGS)
    return {k: v for k, v in kwargs.items() if v is not None}


def sampling_params_dict(params: SamplingParams, stop_token_ids: Sequence[int], request_index: int) -> dict:
    """SGLang's per-request ``sampling_params`` for our :class:`SamplingParams` (same names)."""
    out = {
        "max_new_tokens": int(params.max_new_tokens),
        "temperature": float(params.temperature),  # 0: greedy in SGLang too
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "stop": list(params.stop) or None,
        "stop_regex": list(params.stop_regex) or None,
        "stop_token_ids": sorted(set(int(t) for t in stop_token_ids)) or None,
        "no_stop_trim": True,  # keep the stop string in the text (the PyTorch engine does)
        "skip_special_tokens": True,
        # One seed per request, else the G samples of a prompt would all be the same sample.
        "sampling_seed": None if params.seed is None else int(params.seed) + request_index,
    }
    assert set(out) <= set(SAMPLING_PARAM_KEYS)
    return {k: v for k, v in out.items() if v is not None}


def generation_from_output(prompt_ids: Sequence[int], output: dict) -> Generation:
    """One SGLang ``generate`` output dict → :class:`Generation` (ids and logprobs aligned)."""
    meta = output.get("meta_info")
    if not isinstance(meta, dict):
        raise SGLangEngineError(f"SGLang output has no meta_info (keys: {sorted(output)})")
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, dict) else ""
        raise SGLangEngineError(f"SGLang aborted the request: {message}")
    if kind not in ("stop", "length"):
        raise SGLangEngineError(f"unexpected SGLang finish_reason {finish!r}")
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise SGLangEngineError("SGLang returned no output_token_logprobs (was return_logprob=True passed?)")
    # Each entry is (logprob, token_id, token_text or None).
    completion_ids = [int(e[1]) for e in entries]
    logprobs = [float(e[0]) for e in entries]
    output_ids = output.get("output_ids")
    if output_ids is not None and list(output_ids) != completion_ids:
        raise SGLangEngineError(
            f"SGLang output_ids ({len(output_ids)} tokens) and output_token_logprobs ({len(entries)}) disagree"
        )
    expected = meta.get("completion_tokens")
    if expected is not None and int(expected) != len(completion_ids):
        raise SGLangEngineError(
            f"SGLang reports {expected} completion tokens but {len(completion_ids)} logprobs; cannot align them"
        )
    return Generation(
        prompt_ids=list(prompt_ids),
        completion_ids=completion_ids,
        completion_logprobs=logprobs,
        text=output.get("text") or "",
        finish_reason="length" if kind == "length" else "stop",
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers kill(0) but is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# ---------------------------------------------------------------- the engine


class SGLangRolloutEngine(RolloutEngine):
    def __init__(self, engine, *, stop_token_ids: Sequence[int], memory_saver: bool, device: torch.device):
        self._engine = engine
        self.stop_token_ids = list(stop_token_ids)
        self.memory_saver = memory_saver
        self.device = device
        self._released: list[str] = []
        # name -> shape of the tensors SGLang loaded (the checkpoint's safetensors headers), so a
        # stream that does not cover them is refused before SGLang overwrites any (build_engine).
        self.expected_weights: dict[str, tuple[int, ...]] | None = None
        self.tied_embeddings = False

    @classmethod
    def launch(
        cls, kwargs: dict, *, stop_token_ids: Sequence[int], device: torch.device
    ) -> SGLangRolloutEngine:
        if os.environ.get(RETURN_ORIGINAL_LOGPROB_ENV, "").lower() in ("1", "true", "yes"):
            raise SGLangEngineError(
                f"{RETURN_ORIGINAL_LOGPROB_ENV} is set: SGLang would return logprobs before temperature scaling, "
                "but the trainer compares them with log softmax(logits / T). Unset it."
            )
        if kwargs.get("enable_memory_saver") and importlib.util.find_spec("torch_memory_saver") is None:
            raise SGLangEngineError(
                "sglang.enable_memory_saver needs the package torch_memory_saver (the flake provides it); "
                "install it or set sglang.enable_memory_saver: false"
            )
        module = importlib.import_module(SGLANG_ENGINE_MODULE)
        try:
            engine = getattr(module, SGLANG_ENGINE_CLASS)(**kwargs)
        except Exception as exc:
            raise SGLangEngineError(
                f"SGLang failed to start ({exc.__class__.__name__}: {exc}). Common causes on a GB10: "
                "sgl-kernel not built for sm_121a, ptxas without sm_121a (set TRITON_PTXAS_PATH to CUDA 13's), "
                "or mem_fraction_static too high for the free memory"
            ) from exc
        return cls(
            engine,
            stop_token_ids=stop_token_ids,
            memory_saver=bool(kwargs.get("enable_memory_saver")),
            device=device,
        )

    def _require_engine(self):
        if self._engine is None:
            raise SGLangEngineError("the SGLang engine was shut down")
        return self._engine

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        engine = self._require_engine()
        self._resume(list(self._released))  # generating needs everything back
        sampling = [sampling_params_dict(params, self.stop_token_ids, i) for i in range(len(prompts))]
        try:
            outputs = engine.generate(
                input_ids=[list(map(int, p)) for p in prompts], sampling_params=sampling, return_logprob=True
            )
        except Exception as exc:
            self._raise_if_dead(exc)
            raise SGLangEngineError(f"SGLang generate failed: {exc.__class__.__name__}: {exc}") from exc
        if isinstance(outputs, dict):
            outputs = [outputs]
        if len(outputs) != len(prompts):
            raise SGLangEngineError(f"SGLang returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [generation_from_output(p, o) for p, o in zip(prompts, outputs)]

    # ---------------------------------------------------------------- weights & memory
    def update_weights(self, stream) -> None:
        from slime_gb10.grpo.weight_sync import receive_buckets

        engine = self._require_engine()
        if self.expected_weights is not None:
            from slime_gb10.grpo.weight_sync import check_metadata

            check_metadata(
                stream.metadata,
                {name: (shape, None) for name, shape in self.expected_weights.items()},
                receiver="SGLang model's checkpoint",
                # a checkpoint of a tied model may still carry lm_head.weight; the trainer sends it once
                optional=("lm_head.weight",) if self.tied_embeddings else (),
            )
        if "weights" in self._released:  # weights must exist again before they are overwritten
            self._resume(["weights"])
        for bucket in receive_buckets(stream, device=self.device):
            try:
                result = engine.update_weights_from_tensor(
                    named_tensors=bucket, load_format=None, flush_cache=False
                )
            except Exception as exc:
                self._raise_if_dead(exc)
                raise SGLangEngineError(f"SGLang update_weights_from_tensor failed: {exc}") from exc
            success, message = _as_result(result)
            if not success:
                raise SGLangEngineError(f"SGLang rejected a weight bucket ({bucket[0][0]} ...): {message}")
            del bucket
        engine.flush_cache()  # cached prefixes hold KV computed with the old weights

    def sleep(self) -> None:
        if not self.memory_saver:
            return
        engine = self._require_engine()
        tags = [t for t in MEMORY_TAGS if t not in self._released]
        if tags:
            engine.release_memory_occupation(tags=tags)
            self._released += tags

    def wake(self) -> None:
        self._resume(list(self._released))

    def _resume(self, tags: list[str]) -> None:
        if not tags:
            return
        # Weights first, then the KV cache and CUDA graphs (slime's order).
        ordered = [t for t in ("weights", "kv_cache", "cuda_graph") if t in tags]
        self._require_engine().resume_memory_occupation(tags=ordered)
        self._released = [t for t in self._released if t not in ordered]

    def health_check(self) -> None:
        engine = self._require_engine()
        pids = list(engine.get_all_child_pids())
        dead = [pid for pid in pids if not _pid_alive(pid)]
        if dead:
            raise SGLangEngineError(
                f"SGLang subprocess(es) {dead} of {pids} died (scheduler/detokenizer). Look for the error above "
                "this message; on a GB10 the usual causes are running out of unified memory (lower "
                "sglang.mem_fraction_static) or a kernel missing for sm_121a. The run cannot continue."
            )

    def _raise_if_dead(self, exc: Exception) -> None:
        try:
            self.health_check()
        except SGLangEngineError as dead:
            raise dead from exc

    def shutdown(self) -> None:
        if self._engine is not None:
            try:
                self._engine.shutdown()
            finally:
                self._engine = None


def _as_result(result) -> tuple[bool, str]:
    if isinstance(result, tuple) and len(result) >= 2:
        return bool(result[0]), str(result[1])
    if isinstance(result, dict):
        return bool(result.get("success", True)), str(result.get("message", ""))
    return True, ""


def availability(enable_memory_saver: bool = True) -> tuple[bool, str]:
    """Can this machine run the SGLang engine? ``(ok, reason)`` for the doctor (starts nothing)."""
    if not torch.cuda.is_available():
        return False, "SGLang needs a CUDA GPU (none visible)"
    try:
        import sglang

        importlib.import_module(SGLANG_ENGINE_MODULE)
    except Exception as exc:
        return False, f"SGLang's engine does not import ({exc.__class__.__name__}: {exc})"
    if enable_memory_saver and importlib.util.find_spec("torch_memory_saver") is None:
        return False, "torch_memory_saver is missing (needed for sglang.enable_memory_saver)"
    version = getattr(sglang, "__version__", "?")
    note = "" if version == SGLANG_PIN else f" (adapter checked against {SGLANG_PIN})"
    return True, f"SGLang {version}{note} on {torch.cuda.get_device_name()}"


def build_engine(config, tokenizer, device) -> SGLangRolloutEngine:
    """Registry entry point (``backends.rollout: sglang``)."""
    from slime_gb10.grpo.models import checkpoint_tensor_shapes, eos_token_ids, resolve_model_path

    device = torch.device(device)
    if device.type != "cuda":
        raise SGLangEngineError("the SGLang engine needs a CUDA GPU; on a CPU use rollout: torch")
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = torch.cuda.get_device_capability(index)
    path = resolve_model_path(config.model.name_or_path)
    stop_ids = eos_token_ids(tokenizer, None)
    try:
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(path)
        extra = gen.eos_token_id
        stop_ids += [extra] if isinstance(extra, int) else list(extra or [])
    except Exception:  # no generation_config.json: the tokenizer's EOS is enough
        pass
    kwargs = engine_kwargs(
        config.sglang,
        path,
        seed=config.train.seed,
        device_index=index,
        compute_capability=capability,
        unified_memory=is_unified_memory_gpu(index),
        trust_remote_code=config.model.trust_remote_code,
    )
    log.info("starting SGLang: %s", {k: v for k, v in kwargs.items() if k != "model_path"})
    engine = SGLangRolloutEngine.launch(kwargs, stop_token_ids=stop_ids, device=device)
    engine.expected_weights = checkpoint_tensor_shapes(path)
    engine.tied_embeddings = _tied(path)
    return engine


def _tied(path) -> bool:
    try:
        from transformers import AutoConfig

        return bool(getattr(AutoConfig.from_pretrained(path), "tie_word_embeddings", False))
    except Exception:  # no config readable: treat as untied (lm_head must then be streamed)
        return False
