"""Config files and ``--set`` items as plain dicts, before any validation: a YAML/JSON file or a
shipped recipe by name (:func:`load_config_file`), ``section.key=value`` (:func:`parse_set_override`)
and :func:`deep_set`. :mod:`slime_gb10.grpo.config` validates the merged dict into a GRPOConfig."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml

from slime_gb10.utils.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration cannot be used; the message names the key and the fix."""


RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


def recipes() -> list[str]:
    """The names of the recipes shipped with the package (``--config NAME``)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file, or a shipped recipe by name, into a dict; errors name the file."""
    p = Path(path)
    if not p.is_file() and (RECIPES_DIR / f"{path}.yaml").is_file():
        p = RECIPES_DIR / f"{path}.yaml"
    if not p.is_file():
        raise ConfigError(
            f"config file '{p}' does not exist: pass a YAML/JSON file, or a recipe name ({', '.join(recipes())})"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file '{p}' is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8"
        ) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"config file '{p}' is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping of sections, got {type(data).__name__}")
    return data


def parse_set_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-5"`` -> (["train", "lr"], 1e-5); the value is parsed as a YAML scalar."""
    if "=" not in item:
        raise ConfigError(f"--set expects section.key=value, got '{item}'")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set expects section.key=value, got '{item}'")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value '{raw}': {exc}") from exc
    if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string; numbers are meant
        with contextlib.suppress(ValueError):
            value = float(value) if any(c in value for c in ".eE") else int(value)
    return parts, value


def deep_set(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value
