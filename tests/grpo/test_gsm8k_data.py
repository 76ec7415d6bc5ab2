"""GSM8K through every loader: the local files, the hub path (datasets' own local loading: a folder
laid out as the hub repository openai/gsm8k is), the named spec offline, and a wrong layout."""

from __future__ import annotations

import json

import pytest

from slime_gb10.grpo import data
from slime_gb10.grpo.config import DataConfig
from slime_gb10.grpo.prompts import PromptSampler, load_splits

pytest.importorskip("datasets", reason="the hub loader is Hugging Face datasets' (the gsm8k extra)")


def _first(path, n):
    return [json.loads(line) for line in path.read_text().splitlines()[:n]]


def test_local_files_give_the_ground_truth_after_the_four_hashes(gsm8k_dir):
    train = data.load_prompt_dataset(gsm8k_dir / "train.jsonl")
    test = data.load_prompt_dataset(gsm8k_dir / "test.jsonl")
    assert (len(train), len(test)) == (7473, 1319)
    first = _first(gsm8k_dir / "test.jsonl", 1)[0]
    assert test[0].prompt == first["question"] and test[0].id == "test-0"
    assert test[0].ground_truth == first["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    # by hand, from the file: Janet's ducks (test 0) -> 18
    assert test[0].ground_truth == "18"


@pytest.fixture
def hub_layout(tmp_path, gsm8k_dir):
    """A folder laid out like the hub repository openai/gsm8k (config folder main/, parquet shards,
    README with the configs block): datasets.load_dataset reads it exactly as the hub's."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    repo = tmp_path / "gsm8k"
    (repo / "main").mkdir(parents=True)
    for split in ("train", "test"):
        rows = _first(gsm8k_dir / f"{split}.jsonl", 40)
        pq.write_table(pa.Table.from_pylist(rows), repo / "main" / f"{split}-00000-of-00001.parquet")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n---\n"
    )
    return repo


def test_the_hub_path_through_datasets(hub_layout, gsm8k_dir, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    hub = data.HubDataset(str(hub_layout), "main")
    train = data.load_hub_split(hub, "train")
    test = data.load_hub_split(hub, "test", limit=7)
    assert len(train) == 40 and len(test) == 7
    local = data.load_prompt_dataset(gsm8k_dir / "test.jsonl", limit=7)
    assert [(e.prompt, e.ground_truth) for e in test] == [(e.prompt, e.ground_truth) for e in local]
    # a spec: hf:<repo>:<config>; the named "gsm8k" is hf:openai/gsm8k:main
    assert data.hub_dataset("gsm8k") == data.HubDataset("openai/gsm8k", "main")
    assert data.hub_dataset(f"hf:{hub_layout}:main") == hub
    assert data.hub_dataset("train.jsonl") is None
    # a hub dataset's held-out set is its test split, not a slice of train
    cfg = DataConfig(task="file", path=f"hf:{hub_layout}:main")
    source, evals = load_splits(cfg, seed=0)
    assert len(source) == 40 and [e.id for e in evals] == [f"gsm8k-test-{i}" for i in range(40)]


def test_a_named_dataset_offline_is_one_line_naming_the_local_files(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache" / "datasets"))
    with pytest.raises(data.DatasetError) as err:
        data.load_dataset_spec("gsm8k", "train")
    message = str(err.value)
    assert "openai/gsm8k (main), split train" in message
    assert "--data train.jsonl --set data.eval_path=test.jsonl" in message and "\n" not in message


def test_a_wrong_layout_is_a_clear_error(hub_layout, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(data.DatasetError, match="has no '#### <answer>' line; use layout='generic'"):
        data.load_prompt_dataset(bad, layout="gsm8k")
    with pytest.raises(data.DatasetError, match="neither the GSM8K layout"):
        data.examples_from_records([{"q": "x", "a": "1"}], "hub split", "s")
    with pytest.raises(data.DatasetError, match="names no repository"):
        data.hub_dataset("hf:")


def test_easy_first_starts_with_the_shortest_reference_solutions(gsm8k_dir):
    """The curriculum is measured on the training file alone: the first batches are the questions
    whose reference solutions (the text before ####) are shortest, computed here from the raw lines."""
    train = data.load_prompt_dataset(gsm8k_dir / "train.jsonl")
    raw = [json.loads(line) for line in (gsm8k_dir / "train.jsonl").read_text().splitlines()]
    lengths = [len(r["answer"].rsplit("####", 1)[0].strip()) for r in raw]
    assert [e.difficulty for e in train[:5]] == lengths[:5]
    sampler = PromptSampler(train, batch_size=16, seed=3, order="easy_first")
    first = sampler.next_batch() + sampler.next_batch()
    shortest = sorted(lengths)[:32]
    assert sorted(e.difficulty for e in first) == shortest
    assert [e.difficulty for e in first] == sorted(e.difficulty for e in first)  # in increasing order
    # resumable mid-epoch like the shuffled order
    state = sampler.state_dict()
    ahead = [e.id for e in sampler.next_batch()]
    again = PromptSampler(train, batch_size=16, seed=3, order="easy_first")
    again.load_state_dict(state)
    assert [e.id for e in again.next_batch()] == ahead
    # later epochs are shuffled again
    tiny = PromptSampler(train[:6], batch_size=6, seed=0, order="easy_first")
    epoch0, epoch1 = tiny.next_batch(), tiny.next_batch()
    assert [e.difficulty for e in epoch0] == sorted(e.difficulty for e in train[:6])
    assert sorted(e.id for e in epoch1) == sorted(e.id for e in epoch0)


def test_easy_first_needs_a_difficulty(tmp_path):
    f = tmp_path / "generic.jsonl"
    f.write_text(json.dumps({"prompt": "2+2?", "ground_truth": "4"}) + "\n")
    with pytest.raises(data.DatasetError, match="easy_first needs a difficulty"):
        PromptSampler(data.load_prompt_dataset(f), batch_size=1, order="easy_first")


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        ('{"question": "How many?", "answer": "Nobody knows.\\n#### unknown"}', "no number after '####'"),
        ('{"question": "How many?"}', "the record lacks column 'question' or 'answer'"),
    ],
)
def test_a_corrupted_line_of_the_real_test_file_is_named_by_its_line(gsm8k_dir, tmp_path, corrupt, problem):
    """GSM8K's 1,319 test records, a blank line, then one corrupted record: the error names line 1321
    (the 1,320th record), and a record no completion could ever be rewarded for is refused."""
    path = tmp_path / "test.jsonl"
    text = (gsm8k_dir / "test.jsonl").read_text()
    assert len(text.splitlines()) == 1319 and text.endswith("\n")
    path.write_text(text + "\n" + corrupt + "\n")
    with pytest.raises(data.DatasetError) as info:
        data.load_prompt_dataset(path)
    message = str(info.value)
    assert message.startswith(f"{path}:1321: ") and problem in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("reward", "refused"),
    [
        ("auto", True),
        ("gsm8k:1.0,format:0.1", True),
        ("boxed_math", False),
        ("gsm8k:1.0,boxed_math:1.0", False),
    ],
)
def test_an_answer_with_no_number_is_refused_only_under_a_reward_that_compares_numbers(
    tmp_path, reward, refused
):
    """A GSM8K-layout file of symbolic answers is fine for boxed_math (math-verify compares \\pi),
    and can never be rewarded by gsm8k's number match."""
    path = tmp_path / "symbolic.jsonl"
    rows = [
        {"question": f"Q{i}: the area of a unit circle?", "answer": "A = pi r^2.\n#### \\pi"}
        for i in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(task="file", path=str(path), reward=reward, eval_size=1)
    if refused:
        with pytest.raises(data.DatasetError, match=r"symbolic\.jsonl:1: GSM8K answer ends in '#### \\pi'"):
            load_splits(cfg, seed=0)
    else:
        train, held_out = load_splits(cfg, seed=0)
        assert sorted(e.ground_truth for e in train + held_out) == ["\\pi"] * 3
