"""What every task promises, checked on every task in the registry.

Registry names and reward names, deterministic builders, a held-out split disjoint from training,
the longest prompt, the reference answers scoring full marks, and rewards that stay total and
deterministic under a seeded fuzz of hostile and mutated completions.
"""

from __future__ import annotations

import inspect
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

import task
from task.dataset import EVAL_SHARE, prompt_chars, split_of
from task.rewards import CORRECT_REWARD, FORMAT_REWARD, RewardRole, reward_info

# The registry's tasks, and every other question lastdigit's config asks (chapter 8's): each keeps the
# same promises.
ASKED = [task.get_task("lastdigit", {"ask": ask}) for ask in ("first_digit", "digit_sum")]
TASKS = [*task.TASKS.values(), *ASKED]
IDS = [t.name for t in task.TASKS.values()] + ["lastdigit-first_digit", "lastdigit-digit_sum"]
ALL = pytest.mark.parametrize("t", TASKS, ids=IDS)


def _problem_key(name: str, row: dict[str, Any]) -> tuple:
    """What makes two rows the same problem, written here from the columns, not from the task's code."""
    if name in ("addition", "small-addition"):  # one problem space per range, the same key
        return ("addition", min(row["a"], row["b"]), max(row["a"], row["b"]))
    if name == "countdown":
        return ("countdown", tuple(sorted(row["numbers"])), row["target"])
    if name == "sorting":
        return ("sorting", tuple(sorted(row["numbers"])))
    if name == "lastdigit":
        return ("lastdigit", row["number"])
    raise AssertionError(f"add {name!r} to _problem_key: the disjointness test must know its problems")


def _columns(t: task.Task, rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {c: [r[c] for r in rows] for c in t.reward_columns}


def _score(t: task.Task, completions: list[Any], rows: list[dict[str, Any]]) -> list[list[float]]:
    prompts = [r["prompt"] for r in rows]
    return [f(prompts, completions, **_columns(t, rows)) for f in t.reward_funcs]


def _chat(text: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------- registry


@ALL
def test_registry_and_reward_names(t: task.Task) -> None:
    assert task.get_task(t.name) is t or t in ASKED
    # The lab's MLflow metrics are rewards/correctness_reward/mean and rewards/format_reward/mean for
    # every task: TRL names each metric after the function's __name__.
    assert [f.__name__ for f in t.reward_funcs] == ["correctness_reward", "format_reward"]
    assert t.description and "<ans></ans>" in t.description
    assert "<ans></ans>" in t.system_prompt


@ALL
def test_rewards_take_trls_signature_and_the_columns_they_name(t: task.Task) -> None:
    rows = t.build_dataset(3, seed=0).to_list()
    for func in t.reward_funcs:
        params = inspect.signature(func).parameters
        assert list(params)[:2] == ["prompts", "completions"]
        assert any(p.kind is p.VAR_KEYWORD for p in params.values()), "TRL passes every column"
        required = [n for n, p in params.items() if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
        # A reward needs only the columns the task declares: a caller (the verl chapter) knows what to pass.
        assert set(required) - {"prompts", "completions"} <= set(t.reward_columns)
    assert set(t.reward_columns) <= set(rows[0])


# ---------------------------------------------------------------- builders


@ALL
@pytest.mark.parametrize("split", ["build_dataset", "build_eval_dataset"])
def test_builders_are_deterministic_and_seeded(t: task.Task, split: str) -> None:
    build: Callable = getattr(t, split)
    first = build(60, 7).to_list()
    random.seed(12345)  # global random state must not matter
    assert build(60, 7).to_list() == first
    assert build(60, 8).to_list() != first
    assert build(10, 7).to_list() == first[:10]  # a shorter set is a prefix of a longer one
    for row in first:
        system, user = row["prompt"]
        assert system == {"role": "system", "content": t.system_prompt}
        assert user["role"] == "user" and user["content"]


@ALL
@pytest.mark.parametrize("n", [0, -1, 2.5, True, "10", None])
def test_builders_reject_bad_n_in_one_line(t: task.Task, n: object) -> None:
    for build in (t.build_dataset, t.build_eval_dataset):
        with pytest.raises(ValueError) as info:
            build(n, 0)
        assert "\n" not in str(info.value)


@ALL
@pytest.mark.parametrize("seed", [None, 1.5, "0", True])
def test_builders_reject_bad_seed_in_one_line(t: task.Task, seed: object) -> None:
    with pytest.raises(ValueError) as info:
        t.build_dataset(1, seed)
    assert "\n" not in str(info.value)


@ALL
def test_eval_split_is_disjoint_from_every_training_set(t: task.Task) -> None:
    # The same seeds on both sides and different ones: disjointness must not hinge on the seed.
    train = [r for seed in (0, 1, 2) for r in t.build_dataset(1500, seed).to_list()]
    held_out = [r for seed in (0, 1, 3) for r in t.build_eval_dataset(300, seed).to_list()]
    train_keys = {_problem_key(t.name, r) for r in train}
    eval_keys = {_problem_key(t.name, r) for r in held_out}
    assert not train_keys & eval_keys
    assert not {r["prompt"][1]["content"] for r in train} & {r["prompt"][1]["content"] for r in held_out}
    # Neither side is degenerate: the eval set is mostly distinct problems (all there are, in a space as
    # small as small-addition's 21 held-out sums), the seeds give other rows.
    assert len(eval_keys) >= min(0.9 * len(held_out), 20)
    assert t.build_eval_dataset(50, 0).to_list() != t.build_eval_dataset(50, 1).to_list()


def test_eval_split_holds_about_one_problem_in_eval_share() -> None:
    rng = random.Random(0)
    keys = {(rng.randint(0, 10**6), rng.randint(0, 10**6)) for _ in range(20000)}
    share = sum(split_of(k) == "eval" for k in keys) / len(keys)
    assert abs(share - 1 / EVAL_SHARE) < 0.01
    assert all(split_of(k) == split_of(k) for k in list(keys)[:100])


# ---------------------------------------------------------------- the longest prompt


@ALL
def test_max_prompt_chars_bounds_every_prompt_and_is_reached(t: task.Task) -> None:
    rows = t.build_dataset(2000, 0).to_list() + t.build_eval_dataset(500, 0).to_list()
    longest = max(prompt_chars(r["prompt"]) for r in rows)
    bound = t.max_prompt_chars()
    assert bound == prompt_chars(t.worst_case_prompt())
    assert longest <= bound
    # The worst case is one the builder really makes (not a loose overestimate) in 2500 draws.
    assert longest == bound, (longest, bound)
    system, user = t.worst_case_prompt()
    assert system["content"] == t.system_prompt and user["role"] == "user"


# ---------------------------------------------------------------- reference answers


@ALL
def test_reference_answers_score_full_marks(t: task.Task) -> None:
    rows = t.build_dataset(300, 1).to_list() + t.build_eval_dataset(100, 1).to_list()
    for wrap in ("<ans>{}</ans>", "Done. <ans> {} </ans>", "reasoning...\n<ans>{}</ans>\n"):
        completions = [_chat(wrap.format(t.reference_answer(r))) for r in rows]
        correct, fmt = _score(t, completions, rows)
        assert correct == [CORRECT_REWARD] * len(rows)
        assert fmt == [FORMAT_REWARD] * len(rows)


@ALL
def test_declared_rewards_match_the_functions_and_what_a_perfect_answer_earns(t: task.Task) -> None:
    # What the run doctor reads (metric, maximum, role) must be what TRL logs and the function pays.
    assert [r.name for r in t.rewards] == [f.__name__ for f in t.reward_funcs]
    assert [r.metric for r in t.rewards] == [f"rewards/{f.__name__}/mean" for f in t.reward_funcs]
    assert [r.role for r in t.rewards] == [RewardRole.ANSWER, RewardRole.SHAPING]
    rows = t.build_dataset(100, 7).to_list() + t.build_eval_dataset(50, 7).to_list()
    completions = [_chat(f"<ans>{t.reference_answer(r)}</ans>") for r in rows]
    paid = _score(t, completions, rows)
    assert paid == [[r.max_reward] * len(rows) for r in t.rewards]
    assert t.max_reward == pytest.approx(sum(scores[0] for scores in paid))


@ALL
def test_another_rows_answer_is_not_correct(t: task.Task) -> None:
    rows = t.build_dataset(200, 2).to_list()
    shifted = rows[1:] + rows[:1]
    completions = [_chat(f"<ans>{t.reference_answer(r)}</ans>") for r in shifted]
    correct, fmt = _score(t, completions, rows)
    assert fmt == [FORMAT_REWARD] * len(rows)
    # Some neighbours share an answer by chance; most must not score.
    assert sum(correct) < 0.2 * len(rows)


@pytest.mark.parametrize(
    "text",
    [
        "<ans></ans>",  # the cases
        "<ans>5 79</ans>",
        "<ans>   </ans>",
        "",
        "no tag at all",
        "<ans>{a}</ans><ans>{a}</ans>",  # several tags, each right on its own
        "<ans>{a}</ans> or <ans>0</ans>",
        "<ans><ans>{a}</ans></ans>",
        "<ans>{a}",
        "{a}</ans>",
        "<ANS>{a}</ANS>",
        "<ans>{a}</ans></ans>",
    ],
)
@ALL
def test_malformed_completions_pay_nothing(t: task.Task, text: str) -> None:
    rows = t.build_dataset(5, 3).to_list()
    completions = [_chat(text.format(a=t.reference_answer(r))) for r in rows]
    assert _score(t, completions, rows) == [[0.0] * 5, [0.0] * 5]


# ---------------------------------------------------------------- totality


WEIRD_COMPLETIONS: list[object] = [
    "",
    None,
    42,
    3.5,
    b"<ans>1</ans>",
    [],
    [{}],
    [None, "x"],
    ["<ans>1</ans>"],
    [{"role": "assistant", "content": None}],
    [{"role": "assistant", "content": 5}],
    [{"role": "assistant", "content": [None, 3, {"type": "text", "text": None}]}],
    {"content": {"nested": True}},
    object(),
    "<ans>" * 10_000 + "</ans>" * 10_000,
    "<ans>" + "(" * 5000 + "1" + ")" * 5000 + "</ans>",
    "<ans>" + "1," * 100_000 + "1</ans>",
    "<ans>" + "9" * 100_000 + "</ans>",
    "x" * 1_000_000,
]

WEIRD_COLUMN_VALUES: list[object] = [None, "", "abc", 1.5, True, [], [None], {"a": 1}, object(), b"1", -1]


@ALL
def test_rewards_are_total_on_weird_completions_and_columns(t: task.Task) -> None:
    np = pytest.importorskip("numpy")
    rows = t.build_dataset(len(WEIRD_COMPLETIONS), 4).to_list()
    good = _columns(t, rows)
    column_variants: list[dict[str, Any]] = [good, {c: None for c in t.reward_columns}]
    column_variants += [{c: [v] * len(rows) for c in t.reward_columns} for v in WEIRD_COLUMN_VALUES]
    column_variants += [{c: v[:2] for c, v in good.items()}]  # a short column
    column_variants += [{c: np.array(v, dtype=object) for c, v in good.items()}]
    for func in t.reward_funcs:
        for columns in column_variants:
            for n in (0, 1, len(WEIRD_COMPLETIONS)):
                rewards = func([None] * n, WEIRD_COMPLETIONS[:n], **columns)
                assert len(rewards) == n
                assert all(type(r) is float for r in rewards)
                assert set(rewards) <= {0.0, CORRECT_REWARD, FORMAT_REWARD}
                assert max(rewards, default=0.0) <= reward_info(func).max_reward


def _as_numpy(np: Any, values: list[Any]) -> Any:
    """A column as numpy would hold it: an int array, a 2-d array, or an object array of int arrays."""
    try:
        return np.array(values)
    except ValueError:  # ragged lists (numbers of several lengths)
        column = np.empty(len(values), dtype=object)
        column[:] = [np.asarray(v) for v in values]
        return column


@ALL
def test_numpy_columns_score_like_lists(t: task.Task) -> None:
    np = pytest.importorskip("numpy")
    for seed in (5, 6):
        rows = t.build_dataset(6, seed).to_list()
        completions = [_chat(f"<ans>{t.reference_answer(r)}</ans>") for r in rows]
        completions[0] = _chat("<ans>0</ans>")  # one wrong answer, so the check is not all ones
        prompts = [r["prompt"] for r in rows]
        as_lists = _score(t, completions, rows)
        assert as_lists[0] == [0.0] + [CORRECT_REWARD] * 5
        columns = {c: _as_numpy(np, [r[c] for r in rows]) for c in t.reward_columns}
        assert [f(prompts, completions, **columns) for f in t.reward_funcs] == as_lists


# Pieces the fuzz strings are made of: tags and near-tags, digits, the operators and separators of every
# task's grammar, whitespace of several kinds, non-ASCII digits and signs, words Python would run.
PIECES = [
    "<ans>",
    "</ans>",
    "<ans",
    "</",
    "<",
    ">",
    *"0123456789",
    "00",
    "99",
    "123",
    "999999999999",
    "+",
    "-",
    "*",
    "/",
    "**",
    "//",
    "(",
    ")",
    ",",
    ", ",
    ".",
    " ",
    "\n",
    "\t",
    "\u00a0",
    "e",
    "x",
    "j",
    "_",
    "\u0663",
    "\uff15",
    "\u2212",
    "🙂",
    "__import__('os')",
    "abs",
    "2**999999",
    "",
]


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        i = rng.randint(0, len(chars))
        if op < 0.4:
            chars.insert(i, rng.choice(PIECES))
        elif op < 0.7 and chars:
            del chars[min(i, len(chars) - 1)]
        elif chars:
            chars[min(i, len(chars) - 1)] = rng.choice(PIECES)
    return "".join(chars)


@ALL
def test_fuzz_totality_determinism_and_consistency(t: task.Task) -> None:
    rng = random.Random(f"fuzz/{t.name}")
    rows = t.build_dataset(200, 6).to_list()
    seen = {"correct": 0, "formatted": 0, "neither": 0}
    for i in range(3000):
        row = rows[i % len(rows)]
        answer = t.reference_answer(row)
        kind = rng.random()
        if kind < 0.3:
            text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        elif kind < 0.4:  # the right answer, with prose and whitespace of several kinds around it
            pad = [rng.choice(["", " ", "\n", "\t", "\u00a0"]) for _ in range(2)]
            text = (
                f"{rng.choice(['', 'So: ', 'x<'])}<ans>{pad[0]}{answer}{pad[1]}</ans>{rng.choice(['', '.'])}"
            )
        elif kind < 0.8:
            text = _mutate(rng, f"<ans>{answer}</ans>")
        else:
            text = f"<ans>{_mutate(rng, answer)}</ans>"
        completion = rng.choice([text, _chat(text)])
        correct, fmt = _score(t, [completion], [row])
        assert _score(t, [completion], [row]) == [correct, fmt], ascii(text)  # deterministic
        assert correct in ([0.0], [CORRECT_REWARD]) and fmt in ([0.0], [FORMAT_REWARD]), ascii(text)
        # One parser: the format reward pays exactly when it finds an answer, and a correct answer
        # is always a well-formed one.
        assert (fmt == [FORMAT_REWARD]) == (t.parse_answer(text) is not None), ascii(text)
        if correct == [CORRECT_REWARD]:
            assert fmt == [FORMAT_REWARD], ascii(text)
        seen["correct" if correct[0] else "formatted" if fmt[0] else "neither"] += 1
    # The fuzz is only worth something if it reaches every outcome.
    assert min(seen.values()) > 100, seen


def test_lastdigits_questions_form_a_ladder_its_neighbours_name():
    """Each question's easier and harder neighbours are configs get_task takes back to that question;
    the default is `{}`; the two ends have none; anything else is a one-line error."""
    import json

    ladder = [task.get_task("lastdigit", {"ask": a}) for a in ("first_digit", "last_digit", "digit_sum")]
    assert ladder[1] is task.LASTDIGIT is task.get_task("lastdigit", "{}")
    assert ladder[0].easier is None and ladder[-1].harder is None
    for lower, upper in itertools.pairwise(ladder):
        assert task.get_task("lastdigit", lower.harder) is upper
        assert task.get_task("lastdigit", upper.easier) is lower
    assert ladder[1].harder == json.dumps({"ask": "digit_sum"}) and ladder[0].harder == "{}"
    row = ladder[2].build_dataset(1, 0)[0]
    assert (
        row["target"] == sum(map(int, str(row["number"])))
        and "sum of the digits" in row["prompt"][1]["content"]
    )
    with pytest.raises(ValueError, match="lastdigit takes only"):
        task.get_task("lastdigit", {"ask": "middle_digit"})
    with pytest.raises(ValueError, match="lastdigit takes only"):
        task.get_task("lastdigit", {"numbers": 3})
