"""Which rollout engine and which policy backend a run uses.

Engines live in ``slime_gb10.grpo.engines.<name>_engine`` (``build_engine(config, tokenizer,
device) -> RolloutEngine``) and backends in ``slime_gb10.grpo.backends.<name>_backend``
(``build_backend(config, tokenizer, device) -> PolicyBackend``). Both are imported only when
chosen, so a machine without SGLang or Megatron-core still runs the PyTorch pair.

``"auto"`` picks SGLang + Megatron-core when BOTH import and a CUDA GPU is present (the GB10
production pair), otherwise PyTorch + PyTorch; the choice and the reason are logged.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

import torch

from slime_gb10.utils.errors import UserError

log = logging.getLogger(__name__)

ENGINE_MODULES = {
    "torch": "slime_gb10.grpo.engines.torch.engine",
    "sglang": "slime_gb10.grpo.engines.sglang_engine",
}
BACKEND_MODULES = {
    "torch": "slime_gb10.grpo.backends.torch_backend",
    "megatron": "slime_gb10.grpo.backends.megatron.backend",
}


class BackendUnavailableError(UserError, RuntimeError):
    """The requested engine/backend cannot be imported; the message says what to install."""


@dataclass(frozen=True)
class Choice:
    rollout: str
    trainer: str
    reason: str


def _import(module_name: str):
    return importlib.import_module(module_name)


def _importable(module_name: str) -> tuple[bool, str]:
    """Can this engine/backend run here? Its module must import AND its ``availability()`` agree.

    Importing the adapter is not enough: e.g. sglang installed without its dependencies lets
    our adapter import while SGLang's runtime cannot.
    """
    try:
        module = _import(module_name)
        check = getattr(module, "availability", None)
        return check() if check is not None else (True, "")
    except Exception as exc:  # ImportError, or a broken optional dependency raising anything
        return False, f"{exc.__class__.__name__}: {exc}"


def auto_pair(sglang_ok: bool, megatron_ok: bool) -> tuple[str, str]:
    """What ``auto`` means: the GB10 production pair only when both run, else the PyTorch pair.

    (Mixing, e.g. the PyTorch engine with Megatron-core, is allowed when asked for explicitly.)
    """
    return ("sglang", "megatron") if sglang_ok and megatron_ok else ("torch", "torch")


def resolve(rollout: str, trainer: str, device: torch.device) -> Choice:
    """Turn ``"auto"`` into concrete names (explicit names are kept as given)."""
    if rollout != "auto" and trainer != "auto":
        return Choice(rollout, trainer, "as configured")
    if device.type != "cuda":
        reason = "no CUDA GPU: the PyTorch engine and backend"
        return Choice(
            "torch" if rollout == "auto" else rollout, "torch" if trainer == "auto" else trainer, reason
        )
    sglang_ok, sglang_why = _importable(ENGINE_MODULES["sglang"])
    megatron_ok, megatron_why = _importable(BACKEND_MODULES["megatron"])
    auto_rollout, auto_trainer = auto_pair(sglang_ok, megatron_ok)
    if sglang_ok and megatron_ok:
        reason = "CUDA GPU with SGLang and Megatron-core available"
    else:
        why = "; ".join(w for w in (sglang_why, megatron_why) if w)
        reason = f"SGLang + Megatron-core not both available ({why}): the PyTorch pair"
    return Choice(
        auto_rollout if rollout == "auto" else rollout,
        auto_trainer if trainer == "auto" else trainer,
        reason,
    )


def resolve_engine(rollout: str, device: torch.device) -> str:
    """The engine alone (``slime-gb10 eval``): ``"auto"`` is SGLang on a GPU when it imports, else torch."""
    if rollout != "auto":
        return rollout
    if device.type == "cuda" and _importable(ENGINE_MODULES["sglang"])[0]:
        return "sglang"
    return "torch"


def _load(kind: str, name: str, modules: dict[str, str], attr: str):
    if name not in modules:
        raise BackendUnavailableError(f"unknown {kind} '{name}'; choose one of: auto, {', '.join(modules)}")
    try:
        module = _import(modules[name])
    except ImportError as exc:
        extra = {"sglang": "sglang", "megatron": "megatron"}.get(name)
        hint = (
            f" Install it with: pip install 'slime-gb10[{extra}]' (or use '{kind}: torch')." if extra else ""
        )
        raise BackendUnavailableError(f"the {kind} '{name}' cannot be imported: {exc}.{hint}") from exc
    return getattr(module, attr)


def build_engine(name: str, config, tokenizer, device):
    return _load("rollout engine", name, ENGINE_MODULES, "build_engine")(config, tokenizer, device)


def build_backend(name: str, config, tokenizer, device):
    return _load("trainer backend", name, BACKEND_MODULES, "build_backend")(config, tokenizer, device)


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"backends.device is '{spec}' but no CUDA GPU is visible; use 'auto' or 'cpu'"
        )
    return device


def build_pair(config, tokenizer):
    """(engine, backend, choice, device) for ``config.backends``; logs the choice."""
    device = resolve_device(config.backends.device)
    choice = resolve(config.backends.rollout, config.backends.trainer, device)
    log.info("rollout engine: %s, trainer backend: %s (%s)", choice.rollout, choice.trainer, choice.reason)
    backend = build_backend(choice.trainer, config, tokenizer, device)
    engine = build_engine(choice.rollout, config, tokenizer, device)
    return engine, backend, choice, device
