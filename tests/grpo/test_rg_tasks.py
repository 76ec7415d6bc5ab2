"""reasoning-gym tasks (`--data rg:<task>[,…]`) with the real package: the spec, a fixed held-out set
that no training question repeats, round-robin mixing, and rewards through each task's own scorer
(checked against scoring with the full entry, as reasoning-gym itself does)."""

from __future__ import annotations

import json

import pytest

from slime_gb10.grpo import rewards, rg_tasks
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.data import DatasetError

# The Nix environment does not package reasoning-gym (nix/README.md); pip installs it with [rg].
rg = pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym is not installed (pip install 'slime-gb10[rg]')"
)

# tasks with numbers, words, lists, fractions and probabilities as answers
TASKS = (
    "gcd",
    "lcm",
    "leg_counting",
    "count_bits",
    "letter_counting",
    "spell_backward",
    "word_sorting",
    "number_sorting",
    "fraction_simplification",
    "dice",
    "family_relationships",
    "basic_arithmetic",
)


def test_the_spec_names_reasoning_gym_tasks():
    assert rg_tasks.parse_spec("rg:gcd, lcm") == ["gcd", "lcm"]
    with pytest.raises(DatasetError, match=r"no task 'gdc'.*its tasks: .*gcd"):
        rg_tasks.parse_spec("rg:gdc")
    with pytest.raises(DatasetError, match="names a task twice"):
        rg_tasks.parse_spec("rg:gcd,gcd")
    with pytest.raises(DatasetError, match=r"write rg:<task>"):
        rg_tasks.parse_spec("rg:gcd,")


def test_the_held_out_set_is_fixed_and_never_trained_on():
    train_a, held_a = rg_tasks.load_splits("rg:string_splitting,gcd", eval_size=101, seed=1, train_size=400)
    train_b, held_b = rg_tasks.load_splits("rg:string_splitting,gcd", eval_size=101, seed=2, train_size=400)
    assert [e.prompt for e in held_a] == [e.prompt for e in held_b]  # the run's seed does not move it
    assert [e.prompt for e in train_a] != [e.prompt for e in train_b]
    assert (
        rg_tasks.tasks_of(held_a).count("string_splitting") == 51
        and rg_tasks.tasks_of(held_a).count("gcd") == 50
    )
    for train, held in ((train_a, held_a), (train_b, held_b)):
        assert not {e.prompt for e in train} & {e.prompt for e in held}
    # string_splitting has a few hundred distinct questions: without the filter training would repeat held-out ones
    raw = [e["question"] for e in rg.create_dataset("string_splitting", size=400, seed=1)]
    assert set(raw) & {e.prompt for e in held_a}
    # the held-out tasks alternate, so a periodic eval of the first questions sees both
    assert rg_tasks.tasks_of(held_a)[:6] == ["string_splitting", "gcd"] * 3
    # the same task's held-out questions wherever it stands in the spec
    _, swapped = rg_tasks.load_splits("rg:gcd,string_splitting", eval_size=101, seed=1, train_size=400)
    gcd = [e.prompt for e in held_a if rg_tasks.tasks_of([e]) == ["gcd"]]
    assert [e.prompt for e in swapped if rg_tasks.tasks_of([e]) == ["gcd"]][:50] == gcd[:50]
    assert len({e.id for e in train_a + held_a}) == len(train_a) + len(held_a)


@pytest.mark.parametrize("task", TASKS)
def test_the_reward_is_the_tasks_own_score(task):
    train, _ = rg_tasks.load_splits(f"rg:{task}", eval_size=0, seed=7, train_size=40)
    entries = {e["question"]: e for e in rg.create_dataset(task, size=40, seed=7)}
    scorer = rg.get_score_answer_fn(task)
    assert train
    for example in train:
        entry = entries[example.prompt]
        right = f"Let me think.\n#### {entry['answer']}\nmore text after the answer"
        assert rewards.rg_reward(right, example.ground_truth) == 1.0
        assert rewards.rg_reward(f"<answer>{entry['answer']}</answer>", example.ground_truth) == 1.0
        assert rewards.rg_reward("no final answer here", example.ground_truth) == 0.0
        for wrong in ("#### definitely-not-the-answer", "#### 987654321"):
            got = rewards.rg_reward(wrong, example.ground_truth)
            # a second implementation: the task's scorer on its own full entry, of the same answer
            assert got == scorer(rg_tasks.extract_answer(wrong, str(entry["answer"])), entry) and got < 1.0
    assert json.loads(train[0].ground_truth)["rg"] == task


def test_numbers_are_read_as_a_verifier_that_compares_strings_needs_them():
    (example,) = [e for e in rg_tasks.load_splits("rg:lcm", eval_size=0, seed=3, train_size=5)[0]][:1]
    n = int(json.loads(example.ground_truth)["answer"])
    for written in (f"{n:,}", f"{n}.", f"{n}.0", f"**{n}**", f"{n} apples"):
        assert rewards.rg_reward(f"#### {written}\n", example.ground_truth) == 1.0, written
    assert rewards.rg_reward(f"so it is {n:,}.", example.ground_truth) == 1.0
    assert rg_tasks.extract_answer("#### 0.250", "0.25") == "0.250"  # only whole numbers lose their decimals


def test_tasks_the_reward_cannot_score_are_refused():
    with pytest.raises(DatasetError, match="answers over several lines"):
        rg_tasks.load_splits("rg:rotate_matrix", eval_size=2, seed=0, train_size=4)


@pytest.mark.parametrize("task", ["coin_flip", "game_of_life_halting"])
def test_tasks_whose_verifier_rewards_a_constant_are_refused(task):
    """Session 24 on the H100s: GRPO on coin_flip took held-out pass@1 from 0.11 to 0.89 by answering 0,
    which reasoning-gym 0.1.25's scorer rewards for any probability below 1. Such tasks are refused."""
    with pytest.raises(
        DatasetError, match=rf"task '{task}': its verifier gives full reward to the one answer"
    ):
        rg_tasks.load_splits(f"rg:{task}", eval_size=2, seed=0, train_size=4)


def test_the_constant_answer_check_counts_as_the_verifier_does():
    # coin_flip's scorer: "0" matches the first character of every probability written "0.…" and its
    # partial credit divides by the shorter string: 1/1. Independently: the share of references written
    # "0.…", with those within its tolerance 1e-4 of 0 (written "6.103515625e-05").
    entries = list(rg.create_dataset("coin_flip", size=64, seed=rg_tasks.HELD_OUT_SEED))
    scorer = rg.get_score_answer_fn("coin_flip")
    below_one = sum(str(e["answer"]).startswith("0") or float(e["answer"]) <= 1e-4 for e in entries) / 64
    assert sum(scorer("0", e) == 1.0 for e in entries) / 64 == below_one  # the defect, in the package itself
    assert rg_tasks.constant_answer_defect("coin_flip", entries) == ("0", below_one, 0.0)
    # sound verifiers: a constant is rewarded exactly where it is the reference (gcd's "1" and "2" often are)
    for task in ("gcd", "letter_counting", "chain_sum"):
        assert rg_tasks.constant_answer_defect(task, list(rg.create_dataset(task, size=64, seed=5))) is None
    # puzzle24 accepts any expression that makes 24, with the question's numbers or not: one reference
    # answer passes everywhere (refusing it through load_splits takes minutes: its generator is slow)
    puzzles = list(rg.create_dataset("puzzle24", size=16, seed=5))
    answer, passed, right = rg_tasks.constant_answer_defect("puzzle24", puzzles)
    assert answer in [str(e["answer"]).strip() for e in puzzles] and passed == 1.0 and right <= 2 / 16


def test_the_answer_is_the_marked_one_else_the_last_number_for_numeric_references():
    assert rg_tasks.extract_answer("x #### 12 apples\n#### 13") == "12 apples"
    assert rg_tasks.extract_answer("<answer>a</answer> then <answer>b</answer>") == "b"
    assert rg_tasks.extract_answer("The GCD of 777 and 912 is 3.", "3") == "3"
    assert rg_tasks.extract_answer("The GCD of 777 and 912 is 3.", "reyornac") is None  # words: no guess
    assert rg_tasks.extract_answer("no digits", "3") is None
    (example,) = rg_tasks.load_splits("rg:gcd", eval_size=0, seed=7, train_size=1)[0]
    truth = json.loads(example.ground_truth)["answer"]
    assert rewards.rg_reward(f"So the answer is {truth}.", example.ground_truth) == 1.0


def test_a_run_on_rg_data_takes_the_rg_reward_and_its_own_held_out_set():
    config = build_config(overrides={"data.task": "file", "data.path": "rg:gcd,lcm"})
    assert config.data.reward_spec() == "rg"
    from slime_gb10.grpo.prompts import load_splits

    train, held = load_splits(config.data.model_copy(update={"limit": 30, "eval_size": 8}), seed=0)
    assert len(held) == 8 and len(train) <= 60
    bad = config.data.model_copy(update={"eval_path": "test.jsonl"})
    with pytest.raises(DatasetError, match="holds its own fixed held-out set"):
        load_splits(bad, seed=0)


def test_a_task_takes_settings_of_its_reasoning_gym_config():
    tasks = rg_tasks.parse_tasks("rg:chain_sum:max_terms=2:max_digits=1, basic_arithmetic:operators=+|-,gcd")
    assert [t.label for t in tasks] == [
        "chain_sum:max_digits=1:max_terms=2",  # sorted, so one difficulty has one label
        "basic_arithmetic:operators=+|-",
        "gcd",
    ]
    assert tasks[1].kwargs == {"operators": ("+", "-")}
    # the held-out questions are reasoning-gym's own for that config and the fixed seed
    _, held = rg_tasks.load_splits(
        "rg:chain_sum:max_terms=2:max_digits=1", eval_size=20, seed=0, train_size=50
    )
    expected = rg.create_dataset("chain_sum", size=20, seed=rg_tasks.HELD_OUT_SEED, max_terms=2, max_digits=1)
    assert [e.prompt for e in held] == [entry["question"] for entry in expected]
    assert all(e.prompt.count("+") + e.prompt.count("-") == 1 for e in held)  # two one-digit terms
    assert rg_tasks.tasks_of(held) == ["chain_sum:max_digits=1:max_terms=2"] * 20
    # the settings travel in the ground truth; a task without settings keeps the ground truth it had
    assert json.loads(held[0].ground_truth)["config"] == {"max_digits": 1, "max_terms": 2}
    _, plain = rg_tasks.load_splits("rg:chain_sum", eval_size=2, seed=0, train_size=50)
    assert set(json.loads(plain[0].ground_truth)) == {"rg", "answer", "metadata"}


def test_the_same_task_at_two_difficulties_is_two_tasks():
    train, held = rg_tasks.load_splits(
        "rg:lcm:max_value=50,lcm:min_value=100:max_value=1000", eval_size=20, seed=0, train_size=100
    )
    assert len({e.id for e in train + held}) == len(train) + len(held)
    labels = rg_tasks.tasks_of(held)
    assert labels[:2] == ["lcm:max_value=50", "lcm:max_value=1000:min_value=100"]
    for example in held:
        numbers = [int(n) for n in example.prompt.split(":")[-1].replace(",", " ").split()]
        assert (
            max(numbers) <= 50 if labels[held.index(example)] == "lcm:max_value=50" else min(numbers) >= 100
        )


def test_a_tuple_setting_takes_one_value_and_its_verifier_is_the_configured_tasks():
    _, held = rg_tasks.load_splits(
        "rg:fraction_simplification:max_value=20:max_factor=10:styles=plain",
        eval_size=4,
        seed=0,
        train_size=50,
    )
    truth = json.loads(held[0].ground_truth)
    assert truth["config"] == {"max_factor": 10, "max_value": 20, "styles": "plain"}
    assert all("\\frac" not in e.prompt and "$" not in e.prompt for e in held)
    assert rg_tasks.rg_reward(f"#### {truth['answer']}", held[0].ground_truth) == 1.0
    assert rg_tasks.rg_reward("#### 999/1000", held[0].ground_truth) < 1.0  # (a format credit)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rg:chain_sum:max_terms", r"'max_terms' is not a setting; write <task>:<key>=<value>"),
        ("rg:chain_sum:max_terms=2:max_terms=3", "sets 'max_terms' twice"),
        (
            "rg:chain_sum:colour=red",
            r"refuses the settings \{'colour': 'red'\}.*its settings: min_terms, max_terms",
        ),
        ("rg:chain_sum:max_terms=1:min_terms=2", "refuses the settings.*max_terms must be >= min_terms"),
        ("rg:lcm:max_value=20,lcm:max_value=20", "names a task twice"),
        ("rg::max_terms=2", r"write rg:<task>\[:<key>=<value>"),
    ],
)
def test_bad_settings_are_one_line_errors_before_any_work(spec, message):
    with pytest.raises(DatasetError, match=message):
        rg_tasks.parse_tasks(spec)


def test_an_answer_the_verifier_cannot_read_scores_zero_instead_of_ending_the_run():
    _, held = rg_tasks.load_splits("rg:prime_factorization", eval_size=1, seed=0, train_size=50)
    truth = held[0].ground_truth
    with pytest.raises(ValueError):  # reasoning-gym 0.1.25's own verifier raises on it
        rg.get_score_answer_fn("prime_factorization")("0.5", json.loads(truth))
    assert rg_tasks.rg_reward("#### 0.5", truth) == 0.0
    assert rg_tasks.rg_reward(f"#### {json.loads(truth)['answer']}", truth) == 1.0
