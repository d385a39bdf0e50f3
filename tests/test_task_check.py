"""`task check`: every task the book ships passes, and each way a reward breaks or fools a run is named.

The broken rewards are written as a user would write them, each on a task the book ships (its prompts,
its builders), so the check sees one fault at a time: a reward that raises on an odd completion, one
that pays a substring of the answer, one that returns None, one that pays a non-finite answer in full
(the NaN that slips through `not abs(a - b) > tol`), one that evaluates the completion (Python's
`eval`, SymPy's `parse_expr`), one that takes 50 ms a completion.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import pytest

import task
from task.check import FAST, SLOW_SECONDS, check
from task.rewards import (
    CORRECT_REWARD,
    RewardRole,
    answer_span,
    completion_text,
    declare_reward,
    format_reward,
    int_value,
)

from suite import REPO_ROOT


@pytest.mark.parametrize("name", sorted(task.TASKS))
def test_every_task_the_book_ships_passes(name):
    report = check(task.get_task(name))
    assert report.ok, "\n".join(report.lines())
    assert [f.check for f in report.findings] == [
        "reference",
        "hostile",
        "code",
        "wrong answers",
        "partial credit",
        "deterministic",
        "held out",
        "lengths",
        "speed",
    ]


def _with(base: task.Task, reward) -> task.Task:
    """`base` with `reward` as its answer reward (its format reward kept)."""
    return dataclasses.replace(
        base, name=f"{base.name}-{reward.__name__}", reward_funcs=(reward, format_reward)
    )


def _texts(completions: Any) -> list[str]:
    return [completion_text(c) for c in completions]


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def raises_on_odd_answers(prompts, completions, target, **kwargs):
    return [
        1.0 if int(answer_span(t)) == int(x) else 0.0
        for t, x in zip(_texts(completions), target, strict=True)
    ]


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def pays_a_substring(prompts, completions, target, **kwargs):
    out = []
    for text, expected in zip(_texts(completions), target, strict=True):
        span = (answer_span(text) or "").strip()
        out.append(1.0 if span and span in str(expected) else 0.0)
    return out


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def returns_none(prompts, completions, target, **kwargs):
    out = []
    for text, expected in zip(_texts(completions), target, strict=True):
        span = answer_span(text)
        out.append(None if span is None else float(span.strip() == str(expected)))
    return out


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def pays_nan_in_full(prompts, completions, target, **kwargs):
    out = []
    for text, expected in zip(_texts(completions), target, strict=True):
        try:
            value = float(answer_span(text))
        except (TypeError, ValueError):
            out.append(0.0)
            continue
        out.append(1.0 if not abs(value - float(expected)) > 1e-6 else 0.0)  # NaN compares False
    return out


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def evaluates_the_answer(prompts, completions, target, **kwargs):
    out = []
    for text, expected in zip(_texts(completions), target, strict=True):
        try:
            out.append(1.0 if eval(answer_span(text)) == int_value(expected) else 0.0)  # the fault
        except Exception:
            out.append(0.0)
    return out


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def parses_with_sympy(prompts, completions, target, **kwargs):
    from sympy.parsing.sympy_parser import parse_expr

    out = []
    for text, expected in zip(_texts(completions), target, strict=True):
        try:
            out.append(1.0 if parse_expr(answer_span(text)) == int_value(expected) else 0.0)  # the fault
        except Exception:
            out.append(0.0)
    return out


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def takes_50_ms(prompts, completions, target, **kwargs):
    time.sleep(0.05)
    return task.correctness_reward(prompts, completions, target)


@pytest.mark.parametrize(
    ("reward", "fails", "says"),
    [
        (raises_on_odd_answers, "hostile", "raises_on_odd_answers raised TypeError"),
        (pays_a_substring, "wrong answers", "paid 1 to the answer's first half"),
        (returns_none, "hostile", "returned None"),
        (pays_nan_in_full, "hostile", "pays_nan_in_full paid 1 (in full) to"),
        (evaluates_the_answer, "code", "evaluates_the_answer ran the completion as code"),
        (parses_with_sympy, "code", "parses_with_sympy ran the completion as code"),
        (takes_50_ms, "speed", "a completion"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v)[:20],
)
def test_the_check_fails_each_broken_reward_and_names_the_kind(reward, fails, says):
    rows = 1 if reward is takes_50_ms else 4
    report = check(_with(task.ADDITION, reward), rows=rows)
    assert not report.ok
    failed = {f.check: f.text for f in report.failed}
    assert fails in failed, "\n".join(report.lines())
    assert says in failed[fails], failed[fails]
    assert report.verdict().startswith(f"task check: addition-{reward.__name__} failed ")
    if fails in FAST:  # what a lab refuses before anything loads: the fast part sees it too
        assert not check(_with(task.ADDITION, reward), rows=rows, fast=True).ok


def test_the_speed_threshold_is_far_from_the_books_rewards_and_from_50_ms():
    """The book's rewards take microseconds a completion, 50 ms is twice the threshold: the verdict does
    not hinge on how fast a machine is."""
    speed = next(f for f in check(task.ADDITION).findings if f.check == "speed")
    median_ms = float(speed.text.split("median ")[1].split(" ms")[0])
    assert median_ms < SLOW_SECONDS * 1000 / 20 and 2 * SLOW_SECONDS * 1000 <= 50


def test_partial_credit_is_reported_with_its_share():
    @declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
    def half_for_a_near_miss(prompts, completions, target, **kwargs):
        out = []
        for text, expected in zip(_texts(completions), target, strict=True):
            answer = task.parse_answer(text)
            out.append(1.0 if answer == int_value(expected) else 0.5 if answer is not None else 0.0)
        return out

    report = check(_with(task.ADDITION, half_for_a_near_miss), rows=4)
    partial = next(f for f in report.findings if f.check == "partial credit")
    assert partial.ok is None and "half_for_a_near_miss pays partial credit to" in partial.text
    assert "%" in partial.text and "0.5" in partial.text


def test_a_task_whose_held_out_prompts_are_training_prompts_fails():
    leaky = dataclasses.replace(task.LASTDIGIT, name="leaky", build_eval_dataset=task.LASTDIGIT.build_dataset)
    failed = {f.check: f.text for f in check(leaky).failed}
    assert "held out" in failed and "are training prompts too" in failed["held out"]


def test_a_prompt_longer_than_the_worst_case_fails_the_lengths():
    short = dataclasses.replace(
        task.COUNTDOWN, name="short", worst_case_prompt=task.ADDITION.worst_case_prompt
    )
    failed = {f.check: f.text for f in check(short).failed}
    assert "lengths" in failed and "longer than worst_case_prompt" in failed["lengths"]


def test_the_lengths_in_a_tokenizers_tokens():
    from grpolab.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    fits = next(
        f
        for f in check(
            task.LASTDIGIT, tokenizer=tokenizer, max_prompt_length=224, max_completion_length=32
        ).findings
        if f.check == "lengths"
    )
    assert fits.ok and "tokens" in fits.text
    tight = next(
        f
        for f in check(
            task.LASTDIGIT, tokenizer=tokenizer, max_prompt_length=224, max_completion_length=3
        ).findings
        if f.check == "lengths"
    )
    assert tight.ok is False and "over max_completion_length 3" in tight.text


def test_a_data_file_task_checks_and_splits_by_content(tmp_path):
    path = tmp_path / "products.jsonl"
    rows = [{"q": f"What is {a} times {b}?", "a": str(a * b)} for a in range(30) for b in range(30)]
    rows += rows[:50]  # a question asked twice stays in one split
    path.write_text("\n".join(json.dumps(r) for r in rows))
    t = task.get_task(str(path), {"question": "q", "answer": "a", "checker": "integer"})
    report = check(t)
    assert report.ok, "\n".join(report.lines())
    assert t.source["task_source"] == "data file" and t.source["task_data_rows"] == str(len(rows))
    train = {r["prompt"][1]["content"] for r in t.build_dataset(2000, 0)}
    held_out = {r["prompt"][1]["content"] for seed in (0, 1) for r in t.build_eval_dataset(60, seed)}
    assert held_out and not train & held_out


@pytest.mark.parametrize(
    ("checker", "right", "wrong"),
    [
        ("exact", "Paris", "paris"),
        ("integer", "42", "42.0"),
        ("number", "0.5000001", "0.51"),
        ("math", "\\frac{1}{2}", "0.6"),
    ],
)
def test_each_data_checker_pays_its_right_answer_and_not_a_wrong_one(tmp_path, checker, right, wrong):
    answer = {"exact": "Paris", "integer": "42", "number": "0.5", "math": "0.5"}[checker]
    path = tmp_path / "one.csv"
    path.write_text("question,answer\n" + "".join(f"question {i}?,{answer}\n" for i in range(60)))
    t = task.get_task(str(path), {"checker": checker})
    reward = t.reward_funcs[0]
    paid = reward(None, [f"<ans>{right}</ans>", f"<ans>{wrong}</ans>", "<ans>nan</ans>"], target=[answer] * 3)
    assert paid == [1.0, 0.0, 0.0]


def test_a_data_file_that_cannot_make_a_task_is_one_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "x?", "solution": "1"}))
    for config, says in (
        ({}, "no column 'answer' (it has question, solution)"),
        (
            {"answer": "solution", "checker": "fuzzy"},
            "checker 'fuzzy' is not one of exact, integer, number, math",
        ),
        ({"answer": "solution", "columns": 1}, "a data task takes question, answer"),
    ):
        with pytest.raises(ValueError) as info:
            task.get_task(str(path), config)
        assert says in str(info.value) and "\n" not in str(info.value)


def test_a_reasoning_gym_task_keeps_its_own_scorer_behind_the_books_parse():
    t = task.get_task("reasoning-gym:basic_arithmetic", {"max_terms": 3})
    assert t.source["task_gym_dataset"] == "basic_arithmetic" and json.loads(t.source["task_config"]) == {
        "max_terms": 3
    }
    row = t.build_dataset(1, 0)[0]
    columns = {"gym_seed": [row["gym_seed"]] * 3, "gym_index": [row["gym_index"]] * 3}
    completions = [f"<ans>{row['target']}</ans>", row["target"], "<ans>12345678</ans>"]
    right, untagged, wrong = t.reward_funcs[0](None, completions, **columns)
    assert (right, untagged) == (1.0, 0.0) and wrong < 1.0  # reasoning-gym's partial credit, at most
    report = check(t, rows=4)
    assert report.ok, "\n".join(report.lines())
    held_out = {r["prompt"][1]["content"] for r in t.build_eval_dataset(20, 0)}
    assert not held_out & {r["prompt"][1]["content"] for r in t.build_dataset(300, 0)}


@pytest.mark.slow
def test_the_task_command_checks_and_exits_by_the_verdict(tmp_path):
    """`python -m task check`: 0 for a task that passes, 1 for one that fails, 2 for one that is not a task."""
    broken = tmp_path / "broken.py"
    made = subprocess.run(
        [sys.executable, "-m", "task", "new", "broken", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert made.returncode == 0, made.stderr
    text = broken.read_text()
    broken.write_text(
        text.replace(
            "return correctness_scores(",
            "return [float(eval(completion_text(c) or '0') or 0) for c in completions] or correctness_scores(",
        ).replace("    answer_span,\n", "    answer_span,\n    completion_text,\n")
    )
    runs = {
        "larger": subprocess.run(
            [sys.executable, "-m", "task", "check", str(tmp_path / "broken.py")],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        ),
        "book": subprocess.run(
            [sys.executable, "-m", "task", "check", "lastdigit"],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        ),
        "none": subprocess.run(
            [sys.executable, "-m", "task", "check", "no-such-task"],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        ),
    }
    assert runs["book"].returncode == 0 and runs["book"].stdout.strip().endswith(
        "task check: lastdigit passed 9 checks"
    )
    assert runs["larger"].returncode == 1 and "FAIL  code" in runs["larger"].stdout
    assert runs["none"].returncode == 2 and runs["none"].stderr.count("\n") == 1
    assert "unknown task 'no-such-task'" in runs["none"].stderr


def test_the_survey_of_reasoning_gym_names_each_verdict_and_counts_them(capsys):
    """`python -m task check reasoning-gym:all` on two datasets: one passes, one cannot be built."""
    from task.__main__ import check_gym

    assert check_gym(None, ["basic_arithmetic", "no_such_dataset"], seconds=60) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["basic_arithmetic", "passes"]
    assert (
        out[1].startswith("no_such_dataset")
        and "not built: reasoning-gym has no dataset 'no_such_dataset'" in out[1]
    )
    assert out[-2:] == ["   1  passes", "   1  not built"]


def test_task_new_refuses_a_name_that_is_not_python_and_a_file_that_exists(tmp_path):
    from task.__main__ import new

    with pytest.raises(ValueError, match="is not a Python name"):
        new("my-task", tmp_path)
    new("mine", tmp_path)
    with pytest.raises(ValueError, match=r"mine\.py exists"):
        new("mine", tmp_path)
