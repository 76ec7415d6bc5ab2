"""Prompt data for GRPO: local JSONL/Parquet datasets (chat templates and the sampler:
:mod:`~slime_gb10.grpo.prompts`; generated tasks: :mod:`~slime_gb10.grpo.arithmetic`,
:mod:`~slime_gb10.grpo.rg_tasks`).

- :func:`load_prompt_dataset` reads a local ``.jsonl`` / ``.json`` / ``.parquet`` file in the GSM8K
  layout (``question`` / ``answer`` with the final number after ``####``) or a generic
  ``prompt`` / ``ground_truth`` layout; column names are configurable.
- :func:`load_hub_split` reads one split of a hub dataset, by name (``gsm8k``) or
  ``hf:owner/name[:config]``, through Hugging Face ``datasets``, with the same layouts.
- :func:`load_dataset_spec` is what a run's ``data.path`` / ``data.eval_path`` go through: a local
  file or one split of a hub dataset.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slime_gb10.utils.errors import UserError, first_line

DEFAULT_INSTRUCTION = "Put the final answer after ####."


class DatasetError(UserError, ValueError):
    """A dataset cannot be used; the message names the file, the problem and the fix."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """The dataset path does not exist."""


@dataclass(frozen=True)
class PromptExample:
    """One prompt: the question text (before chat templating), its ground truth, a stable id."""

    prompt: str
    ground_truth: str
    id: str
    # How hard the example looks from the training data alone (GSM8K: the length in characters of
    # the reference solution); None where the layout has no such measure. Orders data.order=easy_first.
    difficulty: float | None = None
    # The reference solution where the data has one (GSM8K: the worked answer): what `slime-gb10 sft` trains on
    solution: str | None = None


# --- files -------------------------------------------------------------------------------------

_GSM8K_KEYS = ("question", "answer")
_GENERIC_KEYS = ("prompt", "ground_truth")


def gsm8k_final_answer(answer: str) -> str | None:
    """The text after the last ``####`` of a GSM8K solution with ``,`` and ``$`` removed (``"1,234"`` -> ``"1234"``)."""
    if "####" not in answer:
        return None
    final = answer.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "").strip()
    return final or None


# A reader returns the records and, for a file of one record a line (JSONL), the 1-based line of
# each: the errors about a record then name FILE:LINE (else FILE: record N).
Records = tuple[list[dict[str, Any]], list[int] | None]


def _read_jsonl(path: Path) -> Records:
    records, lines = [], []
    with path.open("r", encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{path}:{line_no}: invalid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(record, dict):
                raise DatasetError(
                    f"{path}:{line_no}: each line must be a JSON object, got {type(record).__name__}"
                )
            records.append(record)
            lines.append(line_no)
    return records, lines


def _read_json(path: Path) -> Records:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(data, dict):  # {"data": [...]} or a single split
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DatasetError(f"{path}: expected a JSON list of records (or one key holding that list)")
        data = lists[0]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DatasetError(f"{path}: expected a JSON list of objects")
    return data, None


def _read_parquet(path: Path) -> Records:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"{path}: reading Parquet needs pyarrow, which is not installed: pip install pyarrow "
            "(or convert the file to JSONL)"
        ) from None
    try:
        return pq.read_table(path).to_pylist(), None
    except Exception as exc:  # pyarrow raises its own ArrowInvalid etc.
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None


def _read_csv(path: Path) -> Records:
    with path.open("r", encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        records = []
        for record in reader:
            if None in record:  # more fields than the header
                raise DatasetError(
                    f"{path}:{reader.line_num}: {len(record) - 1 + len(record[None])} fields but the header has "
                    f"{len(reader.fieldnames or [])}"
                )
            records.append(record)
    return records, None  # a quoted field may span lines: its errors name the record


_READERS = {
    ".jsonl": _read_jsonl,
    ".ndjson": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
    ".csv": _read_csv,
}


def _columns(records: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records[:100]:
        seen.update(dict.fromkeys(r))
    return list(seen)


def load_prompt_dataset(
    path: str | Path,
    *,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    layout: Literal["auto", "gsm8k", "generic"] = "auto",
    limit: int | None = None,
    numeric_answers: bool = True,
) -> list[PromptExample]:
    """Read prompts and ground truths from a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file.

    Layouts:

    - ``"gsm8k"``: columns ``question`` / ``answer`` (override with ``prompt_key`` / ``answer_key``);
      the ground truth is the text after ``####`` in the answer, with ``,`` and ``$`` removed.
    - ``"generic"``: columns ``prompt`` / ``ground_truth`` (overridable); the ground truth is used as is.
    - ``"auto"``: ``gsm8k`` if the file has ``question`` and ``answer`` (or the given columns and
      every answer contains ``####``), ``generic`` if it has ``prompt`` and ``ground_truth`` (or the
      given columns).

    An ``id`` column is used as the example id when present, else ``"<file stem>-<row>"``.
    Raises :class:`DatasetError` (:class:`DatasetNotFoundError` for a missing path) naming the
    problem: unknown extension, malformed JSON (with the line number), missing columns (listing
    the columns found and the options to set), empty dataset, a GSM8K answer without ``####``.
    Parquet needs ``pyarrow`` (optional dependency).
    """
    p = Path(path)
    if not p.exists():
        raise DatasetNotFoundError(
            f"dataset file '{p}' does not exist; pass the path of a local .jsonl, .json, .parquet or .csv file"
        )
    if p.is_dir():
        raise DatasetError(
            f"dataset path '{p}' is a directory; pass a .jsonl, .json, .parquet or .csv file inside it"
        )
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise DatasetError(
            f"dataset file '{p}' has an unsupported extension {p.suffix!r}; use one of {', '.join(_READERS)}"
        )
    if layout not in ("auto", "gsm8k", "generic"):
        raise DatasetError(f"unknown dataset layout {layout!r}; choose auto, gsm8k or generic")
    try:
        records, lines = reader(p)
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-save it as UTF-8"
        ) from None
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file '{p}': {exc.strerror or exc}") from None
    if limit is not None:
        if limit <= 0:
            raise DatasetError(f"limit must be positive, got {limit}")
        records = records[:limit]
    if not records:
        raise DatasetError(f"dataset file '{p}' has no records")

    return examples_from_records(
        records,
        str(p),
        p.stem,
        prompt_key=prompt_key,
        answer_key=answer_key,
        layout=layout,
        lines=lines[: len(records)] if lines is not None else None,
        numeric_answers=numeric_answers,
    )


def examples_from_records(
    records: list[dict[str, Any]],
    source: str,
    stem: str,
    *,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    layout: Literal["auto", "gsm8k", "generic"] = "auto",
    lines: Sequence[int] | None = None,
    numeric_answers: bool = True,
) -> list[PromptExample]:
    """Records (dicts) of a file or a hub split -> examples; the layout rules of :func:`load_prompt_dataset`.

    An error about one record names it as ``SOURCE:LINE`` when ``lines`` (the 1-based line of each
    record in a JSONL file) is given, else as ``SOURCE: record N`` (1-based). ``numeric_answers``
    (the reward compares numbers: gsm8k) refuses a GSM8K answer with no number after ``####``."""
    p = source
    columns = _columns(records)
    if layout == "auto":
        if prompt_key is None and answer_key is None:
            if all(k in columns for k in _GSM8K_KEYS):
                layout = "gsm8k"
            elif all(k in columns for k in _GENERIC_KEYS):
                layout = "generic"
        else:
            a_key = answer_key or ("answer" if "answer" in columns else "ground_truth")
            answers = [r.get(a_key) for r in records]
            is_gsm8k = all(isinstance(a, str) and "####" in a for a in answers)
            layout = "gsm8k" if is_gsm8k else "generic"
    if layout == "auto":
        raise DatasetError(
            f"dataset '{p}' has columns {columns}: neither the GSM8K layout (question, answer) nor the "
            "generic layout (prompt, ground_truth). Name the columns with prompt_key=/answer_key= "
            "(CLI: --set data.prompt_key=COLUMN --set data.answer_key=COLUMN)."
        )
    default_prompt, default_answer = _GSM8K_KEYS if layout == "gsm8k" else _GENERIC_KEYS
    p_key = prompt_key or default_prompt
    a_key = answer_key or default_answer
    missing = [k for k in (p_key, a_key) if k not in columns]
    if missing:
        raise DatasetError(
            f"dataset '{p}' has no column(s) {missing}; columns found: {columns}. "
            "Set the column names with prompt_key=/answer_key= (CLI: --set data.prompt_key=COLUMN --set data.answer_key=COLUMN)."
        )

    examples = []
    for row, record in enumerate(records):
        where = f"{p}:{lines[row]}" if lines is not None else f"{p}: record {row + 1}"
        if p_key not in record or a_key not in record:
            raise DatasetError(
                f"{where}: the record lacks column {p_key!r} or {a_key!r} (it has {list(record)}); "
                "add it or remove the record"
            )
        prompt = record[p_key]
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f"{where}: column {p_key!r} must be a non-empty string, got {prompt!r:.80}")
        answer = record[a_key]
        if layout == "gsm8k":
            truth = gsm8k_final_answer(answer) if isinstance(answer, str) else None
            if truth is None:
                raise DatasetError(
                    f"{where}: GSM8K answer {answer!r:.80} has no '#### <answer>' line; use layout='generic' "
                    "if the column already holds the final answer"
                )
            if numeric_answers and not any(c.isdigit() for c in truth):
                raise DatasetError(
                    f"{where}: GSM8K answer ends in '#### {truth:.40}' with no number after '####', so no "
                    "completion can ever be rewarded for it; write the final number there or remove the record"
                )
        else:
            if answer is None or (isinstance(answer, str) and not answer.strip()):
                raise DatasetError(f"{where}: empty ground truth in column {a_key!r}")
            truth = answer.strip() if isinstance(answer, str) else json.dumps(answer)
        example_id = str(record["id"]) if record.get("id") is not None else f"{stem}-{row}"
        difficulty = float(len(answer.rsplit("####", 1)[0].strip())) if layout == "gsm8k" else None
        examples.append(
            PromptExample(
                prompt=prompt,
                ground_truth=truth,
                id=example_id,
                difficulty=difficulty,
                solution=answer if layout == "gsm8k" else None,
            )
        )
    return examples


def split_train_eval(
    examples: Sequence[PromptExample],
    *,
    eval_fraction: float = 0.1,
    eval_size: int | None = None,
    seed: int = 0,
) -> tuple[list[PromptExample], list[PromptExample]]:
    """Deterministic train/eval split: ``eval_size`` examples (else ``round(eval_fraction * n)``, at least 1).

    The eval examples are picked by a seeded shuffle; both parts keep the original order.
    :class:`DatasetError` if nothing would be left to train on.
    """
    n = len(examples)
    if eval_size is None:
        if not 0.0 <= eval_fraction < 1.0:
            raise DatasetError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        eval_size = 0 if eval_fraction == 0 else max(1, round(eval_fraction * n))
    if eval_size < 0:
        raise DatasetError(f"eval_size must be >= 0, got {eval_size}")
    if eval_size >= n:
        raise DatasetError(
            f"holding out {eval_size} eval examples leaves no training prompts from {n} examples; "
            f"use an eval size below {n} (or 0 for no eval)"
        )
    order = list(range(n))
    random.Random(f"split:{seed}").shuffle(order)
    eval_idx = set(order[:eval_size])
    train = [e for i, e in enumerate(examples) if i not in eval_idx]
    evals = [e for i, e in enumerate(examples) if i in eval_idx]
    return train, evals


# ---------------------------------------------------------------- the hub
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
    hub: HubDataset, split: str, *, limit: int | None = None, **columns
) -> list[PromptExample]:
    """One split of a hub dataset through ``datasets.load_dataset`` (its local cache first, then the hub).

    ``hub.repo`` may also be a local directory laid out like the hub repository (what
    ``datasets`` itself accepts). ``columns``: :func:`load_prompt_dataset`'s ``prompt_key``,
    ``answer_key``, ``layout`` and ``numeric_answers``, the same rules for both. Errors are
    :class:`DatasetError` naming the fix: the missing extra, or, without network, the local files
    to pass instead.
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
        first = first_line(exc)
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
    return examples_from_records(records, name, stem, **columns)


def load_dataset_spec(spec: str, split: Literal["train", "test"] = "train", **kwargs) -> list[PromptExample]:
    """A file path, a named dataset or ``hf:owner/name[:config]``: its ``split`` (files have one)."""
    hub = hub_dataset(spec)
    if hub is None:
        return load_prompt_dataset(spec, **kwargs)
    return load_hub_split(hub, hub.train_split if split == "train" else hub.test_split, **kwargs)
