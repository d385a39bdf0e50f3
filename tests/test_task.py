"""The addition task and its rewards: dataset determinism, every parsing edge case, never raising."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
import re
from pathlib import Path

import datasets
import pytest

import task
from task import addition
from task.rewards import (
    MAX_DIGITS,
    REWARDS,
    RewardInfo,
    RewardRole,
    UndeclaredRewardError,
    completion_text,
    correctness_reward,
    declare_reward,
    format_reward,
    parse_answer,
    reward_info,
)

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- registry


@pytest.mark.parametrize("name", ["multiplication", "", "Addition", None, ["addition"]])
def test_unknown_task_lists_known_tasks_in_one_line(name: object) -> None:
    with pytest.raises(task.UnknownTaskError) as info:
        task.get_task(name)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert "known tasks: " + ", ".join(sorted(task.TASKS)) in message
    assert not message.startswith("'")  # not KeyError's quoted-key rendering
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_rewards_registry_names_match_function_names() -> None:
    # TRL logs rewards/<__name__>/mean, so the registry key, the name and the metric must agree, and
    # REWARDS names exactly the metrics every task logs (one metric name per reward, whatever the task).
    for name, func in REWARDS.items():
        assert func.__name__ == name
        assert reward_info(func).name == name and reward_info(func).metric == f"rewards/{name}/mean"
    logged = {f.__name__ for t in task.TASKS.values() for f in t.reward_funcs}
    assert set(REWARDS) == logged


def test_declaring_a_reward_leaves_the_function_as_it_was() -> None:
    def plain(prompts, completions, **kwargs):
        return [1.0 for _ in completions]

    signature = inspect.signature(plain)
    declared = declare_reward(0.5, "shaping")(plain)
    assert declared is plain and inspect.signature(declared) == signature and declared.__name__ == "plain"
    assert declared(None, ["a", "b"]) == [1.0, 1.0]
    assert reward_info(declared) == RewardInfo("plain", 0.5, RewardRole.SHAPING)
    with pytest.raises(ValueError):
        declare_reward(1.0, "bonus")  # a role nobody reads fails at declaration


def test_a_wrapper_keeps_the_declaration_and_a_renamed_function_loses_it() -> None:
    @functools.wraps(correctness_reward)
    def logged(*args, **kwargs):
        return correctness_reward(*args, **kwargs)

    assert reward_info(logged) == reward_info(correctness_reward)
    logged.__name__ = "logged_reward"  # TRL would log rewards/logged_reward/mean
    with pytest.raises(UndeclaredRewardError, match="logged_reward"):
        reward_info(logged)


def test_a_task_refuses_rewards_the_doctor_could_not_read() -> None:
    def bare_reward(prompts, completions, **kwargs):
        return [0.0 for _ in completions]

    with pytest.raises(UndeclaredRewardError, match="bare_reward"):
        dataclasses.replace(task.ADDITION, reward_funcs=(correctness_reward, bare_reward))
    with pytest.raises(ValueError, match="share"):
        dataclasses.replace(
            task.ADDITION, reward_funcs=(correctness_reward, task.countdown.correctness_reward)
        )
    with pytest.raises(ValueError, match="answer"):
        dataclasses.replace(task.ADDITION, reward_funcs=(format_reward,))


# ---------------------------------------------------------------- dataset


def test_dataset_columns_and_shape() -> None:
    ds = addition.build_dataset(50, seed=0)
    assert isinstance(ds, datasets.Dataset)
    assert len(ds) == 50
    assert set(ds.column_names) == {"prompt", "target", "a", "b"}
    row = ds[0]
    system, user = row["prompt"]
    assert system == {"role": "system", "content": addition.SYSTEM_PROMPT}
    assert user["role"] == "user"
    assert user["content"] == f"What is {row['a']} + {row['b']}?"


def test_dataset_range_and_targets() -> None:
    ds = addition.build_dataset(2000, seed=1)
    for a, b, target in zip(ds["a"], ds["b"], ds["target"], strict=True):
        assert 0 <= a <= 999 and 0 <= b <= 999
        assert isinstance(target, int) and target == a + b
    # 2000 draws should reach both ends' neighbourhoods; a narrow range would be a bug.
    assert min(ds["a"]) < 10 and max(ds["a"]) > 989


def test_dataset_is_deterministic_and_seed_dependent() -> None:
    first = addition.build_dataset(100, seed=7).to_list()
    random.seed(12345)  # global random state must not matter
    assert addition.build_dataset(100, seed=7).to_list() == first
    assert addition.build_dataset(100, seed=8).to_list() != first
    # A shorter dataset with the same seed is a prefix of the longer one.
    assert addition.build_dataset(10, seed=7).to_list() == first[:10]


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "10"])
def test_dataset_rejects_bad_n_in_one_line(n: object) -> None:
    with pytest.raises(ValueError) as info:
        addition.build_dataset(n, seed=0)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_system_prompt_names_the_tag_and_is_short() -> None:
    assert "<ans></ans>" in addition.SYSTEM_PROMPT
    assert len(addition.SYSTEM_PROMPT) <= 100


# ---------------------------------------------------------------- completion_text


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("plain <ans>1</ans>", "plain <ans>1</ans>"),
        ("", ""),
        ([{"role": "assistant", "content": "hi"}], "hi"),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "<ans>"}, {"type": "text", "text": "5</ans>"}],
                }
            ],
            "<ans>5</ans>",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "image", "image": None}, {"type": "text", "text": "x"}],
                }
            ],
            "x",
        ),
        ([{"role": "assistant", "content": None}], ""),
        ([{"role": "assistant"}], ""),
        ([], ""),
        (None, ""),
        (42, ""),
        ({"role": "assistant", "content": "dict"}, "dict"),
        # A tool-calling completion: the answer is in the last assistant turn.
        (
            [
                {"role": "assistant", "content": "call"},
                {"role": "tool", "content": "<ans>9</ans>"},
                {"role": "assistant", "content": "<ans>3</ans>"},
            ],
            "<ans>3</ans>",
        ),
        ([{"role": "tool", "content": "t"}], ""),
        (["not", "messages"], ""),
    ],
)
def test_completion_text(completion: object, expected: str) -> None:
    assert completion_text(completion) == expected


# ---------------------------------------------------------------- parsing and rewards

BIG = "x" * 1_000_000
# (completion text, parsed answer). The format reward pays 0.2 exactly when there is an answer.
CASES: list[tuple[str, int | None]] = [
    ("<ans>579</ans>", 579),
    ("The sum is <ans>579</ans>.", 579),
    ("<ans> 579 </ans>", 579),
    ("<ans>\n579\n</ans>", 579),
    ("<ans>\t579</ans>", 579),
    ("<ans>007</ans>", 7),
    ("<ans>0</ans>", 0),
    ("<ans>000</ans>", 0),
    ("<ans>-5</ans>", -5),
    ("<ans> -05 </ans>", -5),
    ("<ans>" + "9" * MAX_DIGITS + "</ans>", int("9" * MAX_DIGITS)),
    ("<ans>579</ans>" + BIG, 579),
    (BIG + "<ans>579</ans>", 579),
    ("<ans>579</ans> 🙂 ünïcödé", 579),
    # One tag, but not holding one integer: no answer, so neither reward (the chapter's regex).
    ("<ans></ans>", None),
    ("<ans>   </ans>", None),
    ("<ans>5 79</ans>", None),
    ("<ans>5 7 9</ans>", None),
    ("<ans>+5</ans>", None),  # the chapter's regex is -?\d+: no plus sign
    ("<ans>- 5</ans>", None),
    ("<ans>+-5</ans>", None),
    ("<ans>--5</ans>", None),
    ("<ans>5-</ans>", None),
    ("<ans>5+3</ans>", None),
    ("<ans>579.0</ans>", None),
    ("<ans>1,000</ans>", None),
    ("<ans>1_000</ans>", None),
    ("<ans>0x1F</ans>", None),
    ("<ans>1e3</ans>", None),
    ("<ans>five</ans>", None),
    ("<ans>the sum is 579</ans>", None),
    ("<ans>\u0663</ans>", None),  # Arabic-Indic three: int() would take it
    ("<ans>\uff15</ans>", None),  # full-width five
    ("<ans>\u22125</ans>", None),  # U+2212 minus sign
    ("<ans>" + "1" * (MAX_DIGITS + 1) + "</ans>", None),
    ("<ans>" + "7" * 5000 + "</ans>", None),  # beyond int()'s 4300-digit limit
    # Not exactly one tag pair: neither.
    ("", None),
    ("579", None),
    (BIG, None),
    ("🙂" * 1000, None),
    ("<ans>579", None),
    ("579</ans>", None),
    ("</ans>579<ans>", None),
    ("<ans>5</ans><ans>5</ans>", None),
    ("<ans>5</ans><ans>x</ans>", None),  # the regex matches once, but there are two tags
    ("<ans>5</ans> then <ans>6</ans>", None),
    ("<ans><ans>5</ans></ans>", None),
    ("<ans><ans>5</ans>", None),
    ("<ans>5</ans></ans>", None),
    ("<ans>5</ans><ans>", None),
    ("<ANS>5</ANS>", None),
    ("<ans >5</ans>", None),
    ("<ans>5</ ans>", None),
    ("<ans>5<ans/>", None),
]


def _ids(case: tuple[str, int | None]) -> str:
    text = case[0]
    return ascii(text if len(text) <= 40 else text[:20] + f"...({len(text)} chars)")


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_parse_answer(case: tuple[str, int | None]) -> None:
    text, answer = case
    assert parse_answer(text) == answer


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_format_reward(case: tuple[str, int | None]) -> None:
    text, answer = case
    fmt = 0.2 if answer is not None else 0.0
    assert format_reward([None], [text]) == [fmt]
    assert format_reward([None], [[{"role": "assistant", "content": text}]]) == [fmt]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_correctness_reward(case: tuple[str, int | None]) -> None:
    text, answer = case
    conversational = [{"role": "assistant", "content": text}]
    if answer is None:
        for target in (0, 579, -5, 5):
            assert correctness_reward([None], [text], target=[target]) == [0.0]
    else:
        for completion in (text, conversational):
            assert correctness_reward([None], [completion], target=[answer]) == [1.0]
            assert correctness_reward([None], [completion], target=[str(answer)]) == [1.0]
            assert correctness_reward([None], [completion], target=[answer + 1]) == [0.0]


def test_the_issues_completions_pay_nothing() -> None:
    # Before: format_reward paid 0.2 for these, where the chapter's definition pays nothing.
    texts = ["<ans></ans>", "<ans>5 79</ans>", "<ans>5</ans><ans>5</ans>"]
    assert format_reward([None] * 3, texts) == [0.0, 0.0, 0.0]
    assert correctness_reward([None] * 3, texts, target=[5, 579, 5]) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("target", [579, "579", " 579 ", "0579"])
def test_target_as_int_or_str(target: object) -> None:
    assert correctness_reward([None], ["<ans>579</ans>"], target=[target]) == [1.0]


@pytest.mark.parametrize(
    "target", [None, "", "abc", "57 9", "+579", 579.0, 579.5, True, [579], {"v": 579}, object()]
)
def test_malformed_target_scores_zero(target: object) -> None:
    assert correctness_reward([None], ["<ans>579</ans>"], target=[target]) == [0.0]


def test_true_target_does_not_match_one() -> None:
    # bool is an int subclass; a True target is malformed, not the number 1.
    assert correctness_reward([None], ["<ans>1</ans>"], target=[True]) == [0.0]


def test_numpy_integer_target() -> None:
    np = pytest.importorskip("numpy")
    assert correctness_reward([None], ["<ans>579</ans>"], target=[np.int64(579)]) == [1.0]
    assert correctness_reward([None] * 2, ["<ans>1</ans>", "<ans>2</ans>"], target=np.array([1, 2])) == [
        1.0,
        1.0,
    ]


def test_target_list_length_mismatch_never_raises() -> None:
    completions = ["<ans>1</ans>", "<ans>2</ans>", "<ans>3</ans>"]
    assert correctness_reward([None] * 3, completions, target=[1]) == [1.0, 0.0, 0.0]
    assert correctness_reward([None] * 3, completions, target=[1, 2, 3, 4]) == [1.0, 1.0, 1.0]
    assert correctness_reward([None] * 3, completions, target=None) == [0.0, 0.0, 0.0]
    assert correctness_reward([None] * 3, completions, target=2) == [0.0, 1.0, 0.0]


WEIRD_COMPLETIONS: list[object] = [
    "",
    None,
    42,
    b"<ans>1</ans>",
    [],
    [{}],
    [{"role": "assistant", "content": None}],
    [{"role": "assistant", "content": 5}],
    [{"role": "assistant", "content": [None, 3, {"type": "text", "text": None}]}],
    [{"role": "assistant", "content": [{"type": "text", "text": "<ans>1</ans>"}]}],
    [None, "x"],
    {"content": {"nested": True}},
    "<ans>" * 10_000 + "</ans>" * 10_000,
    BIG,
]


@pytest.mark.parametrize("func", [correctness_reward, format_reward])
def test_length_invariant_and_float_type(func: object) -> None:
    for n in (0, 1, 3, len(WEIRD_COMPLETIONS)):
        completions = (WEIRD_COMPLETIONS * 2)[:n]
        rewards = func([None] * n, completions, target=[1] * n)  # type: ignore[operator]
        assert len(rewards) == n
        assert all(type(r) is float for r in rewards)


# ---------------------------------------------------------------- seeded fuzz

PIECES = [
    "<ans>",
    "</ans>",
    "<ans",
    "ans>",
    "</",
    "<",
    ">",
    "/",
    "0",
    "1",
    "7",
    "9",
    "00",
    "123",
    "+",
    "-",
    " ",
    "\n",
    "\t",
    ".",
    ",",
    "e",
    "x",
    "\u0663",
    "\uff15",
    "\u2212",
    "🙂",
    "é",
    "\u00a0",
    "\u3000",
    "",
]
# The chapter's regex <ans>\s*(-?\d+)\s*</ans> as a spec: no tag outside the one match, ASCII digits,
# at most MAX_DIGITS of them.
_OUTSIDE = r"(?:(?!<ans>|</ans>).)*"
_REFERENCE = re.compile(rf"{_OUTSIDE}<ans>\s*(-?[0-9]{{1,{MAX_DIGITS}}})\s*</ans>{_OUTSIDE}", re.DOTALL)
_REFERENCE_TAG = re.compile(rf"{_OUTSIDE}<ans>{_OUTSIDE}</ans>{_OUTSIDE}", re.DOTALL)


def test_fuzz_against_reference_regex() -> None:
    rng = random.Random(20261129)
    seen = {"answer": 0, "tag_only": 0, "none": 0}
    for _ in range(5000):
        if rng.random() < 0.5:
            text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        else:
            # Near-miss answers: a well-formed integer with a random piece sometimes slipped in.
            body = [
                rng.choice(["", " ", "\n"]),
                rng.choice(["", "", "+", "-"]),
                "".join(rng.choice("0123456789") for _ in range(rng.randint(1, MAX_DIGITS + 2))),
                rng.choice(["", " ", "\t"]),
            ]
            if rng.random() < 0.5:
                body.insert(rng.randint(0, len(body)), rng.choice(PIECES))
            text = (
                rng.choice(["", "", "a ", "<ans>"])
                + "<ans>"
                + "".join(body)
                + "</ans>"
                + rng.choice(["", "", " b", "</ans>", "<ans>"])
            )
        match = _REFERENCE.fullmatch(text)
        expected = int(match.group(1)) if match else None
        tagged = _REFERENCE_TAG.fullmatch(text) is not None
        assert parse_answer(text) == expected, ascii(text)
        assert format_reward([None], [text]) == [0.2 if expected is not None else 0.0], ascii(text)
        target = expected if expected is not None else rng.randint(-5, 5)
        want = 1.0 if expected is not None else 0.0
        chat = [[{"role": "assistant", "content": text}]]
        assert correctness_reward([None], chat, target=[target]) == [want]
        assert correctness_reward([None], chat, target=[target]) == [want]  # deterministic
        seen["answer" if expected is not None else "tag_only" if tagged else "none"] += 1
    # The fuzz is only worth something if it reaches every outcome often, the well-formed tag
    # around a non-integer (the issue's case) included.
    assert min(seen.values()) > 300, seen


# ---------------------------------------------------------------- TRL's calling convention


def _trl_reward_kwargs(n: int) -> dict[str, object]:
    """Keyword arguments as GRPOTrainer._calculate_rewards (TRL 1.15) passes them to a sync reward function.

    Every dataset column except prompt/completion/completion_ids, one value per completion, plus
    completion_ids, trainer_state, log_extra and log_metric (environments only with an environment_factory).
    """
    ds = addition.build_dataset(n, seed=0)
    return {
        "prompts": ds["prompt"],
        "completions": [[{"role": "assistant", "content": f"<ans>{t}</ans>"}] for t in ds["target"]],
        "completion_ids": [[1, 2, 3]] * n,
        "target": ds["target"],
        "a": ds["a"],
        "b": ds["b"],
        "trainer_state": object(),
        "log_extra": lambda *args, **kwargs: None,
        "log_metric": lambda *args, **kwargs: None,
        "environments": None,
    }


@pytest.mark.parametrize("func", [correctness_reward, format_reward])
def test_signature_binds_trl_kwargs(func: object) -> None:
    kwargs = _trl_reward_kwargs(4)
    inspect.signature(func).bind(**kwargs)  # type: ignore[arg-type]
    rewards = func(**kwargs)  # type: ignore[operator]
    expected = 1.0 if func is correctness_reward else 0.2
    assert rewards == [expected] * 4


@pytest.mark.slow
def test_import_task_stays_light() -> None:
    # Argument checks (an unknown task name) should answer before heavy libraries load.
    import subprocess
    import sys

    code = (
        "import sys, task; [task.get_task(n) for n in ('addition', 'countdown', 'sorting')];"
        "print('datasets' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]
