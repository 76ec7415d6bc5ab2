"""Datasets by name (``gsm8k``) or hub spec (``hf:owner/name[:config]``), through Hugging Face ``datasets``.

:func:`load_dataset_spec` is what a run's ``data.path`` / ``data.eval_path`` go through: a local file
(:func:`slime_gb10.grpo.data.load_prompt_dataset`), or one split of a hub dataset, whose records get
the same layout rules (:func:`slime_gb10.grpo.data.examples_from_records`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slime_gb10.grpo.data import DatasetError, PromptExample, examples_from_records, load_prompt_dataset


@dataclass(frozen=True)
class HubDataset:
    """A dataset on the Hugging Face hub: repository, config and the names of its two splits."""

    repo: str
    config: str | None = None
    train_split: str = "train"
    test_split: str = "test"


# `--data NAME`: the datasets a recipe can name without a path.
NAMED_DATASETS = {"gsm8k": HubDataset("openai/gsm8k", "main")}


def hub_dataset(spec: str) -> HubDataset | None:
    """The hub dataset a spec names (``gsm8k``, ``hf:owner/name``, ``hf:owner/name:config``), else None (a path)."""
    if spec in NAMED_DATASETS:
        return NAMED_DATASETS[spec]
    if spec.startswith("hf:"):
        repo, _, config = spec[3:].partition(":")
        if not repo:
            raise DatasetError(f"dataset spec {spec!r} names no repository; write hf:owner/name[:config]")
        return HubDataset(repo, config or None)
    return None


def load_hub_split(
    hub: HubDataset,
    split: str,
    *,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    layout: Literal["auto", "gsm8k", "generic"] = "auto",
    limit: int | None = None,
    numeric_answers: bool = True,
) -> list[PromptExample]:
    """One split of a hub dataset through ``datasets.load_dataset`` (its local cache first, then the hub).

    ``hub.repo`` may also be a local directory laid out like the hub repository (what
    ``datasets`` itself accepts). Errors are :class:`DatasetError` naming the fix: the missing
    extra, or, without network, the local files to pass instead.
    """
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"loading {hub.repo} needs Hugging Face datasets: pip install 'slime-gb10[gsm8k]', or pass "
            "local files (--data train.jsonl --set data.eval_path=test.jsonl)"
        ) from None
    name = f"{hub.repo}" + (f" ({hub.config})" if hub.config else "") + f", split {split}"
    try:
        ds = datasets.load_dataset(hub.repo, hub.config, split=split)
    except Exception as exc:  # network, unknown repo/config/split: all one message for the user
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DatasetError(
            f"cannot load {name} through datasets: {first}. Without network pass local files in the same "
            "layout instead: --data train.jsonl --set data.eval_path=test.jsonl"
        ) from None
    records = ds.to_list()
    if limit is not None:
        records = records[:limit]
    if not records:
        raise DatasetError(f"{name} has no records")
    stem = f"{hub.repo.rstrip('/').rsplit('/', 1)[-1]}-{split}"
    return examples_from_records(
        records, name, stem, prompt_key=prompt_key, answer_key=answer_key, layout=layout,
        numeric_answers=numeric_answers,
    )  # fmt: skip


def load_dataset_spec(spec: str, split: Literal["train", "test"] = "train", **kwargs) -> list[PromptExample]:
    """A file path, a named dataset or ``hf:owner/name[:config]``: its ``split`` (files have one)."""
    hub = hub_dataset(spec)
    if hub is None:
        return load_prompt_dataset(spec, **kwargs)
    return load_hub_split(hub, hub.train_split if split == "train" else hub.test_split, **kwargs)
