"""The run doctor on logged histories built to show each problem, and on a healthy one."""

from __future__ import annotations

import re

import pytest
from conftest import LAB_DIR

from grpolab.doctor import diagnose, verdict
from grpolab.evaluate import EvalResult
from grpolab.session import parser
from grpolab.settings import FLAGS, lab_settings

VALUES = {name: getattr(lab_settings(LAB_DIR, "gpu"), name) for name in FLAGS}
STEPS = 40


def history(**series) -> list[dict[str, float]]:
    """A healthy run by default: rewards rising, groups varied, KL and entropy steady."""
    rows = []
    for i in range(STEPS):
        t = i / (STEPS - 1)
        row = {
            "loss": 0.01,
            "reward": 0.2 + 0.6 * t,
            "rewards/format_reward/mean": 0.1 + 0.1 * t,
            "rewards/correctness_reward/mean": 0.1 + 0.5 * t,
            "frac_reward_zero_std": 0.1,
            "completions/clipped_ratio": 0.05,
            "kl": 0.02,
            "entropy": 1.0,
        }
        for key, f in series.items():
            row[key] = f(t)
        rows.append({"step": i + 1, **row})
    return rows


def names(findings) -> set[str]:
    return {f.name for f in findings}


def test_a_healthy_run_has_no_findings():
    before = EvalResult("base", 64, 0.1, 0.3, 200.0)
    after = EvalResult("adapter", 64, 0.4, 0.95, 180.0)
    findings = diagnose(history(), VALUES, set(FLAGS), before, after)
    assert findings == []
    assert verdict(findings, before, after).startswith("Run doctor: nothing held learning back.")


@pytest.mark.parametrize(
    ("series", "expected", "words"),
    [
        # Unsloth's Qwen3-4B notebook log: 47 of 100 steps with all-equal groups, reward never rising.
        (
            {"frac_reward_zero_std": lambda t: 1.0 if int(t * 100) % 2 else 0.0, "reward": lambda t: 0.05},
            "no_learning_signal",
            "raise --num-generations (now 8) or raise --temperature (now 1)",
        ),
        (
            {"completions/clipped_ratio": lambda t: 0.4},
            "completions_cut",
            "raise --max-completion-length (now 768)",
        ),
        (
            {"kl": lambda t: 0.02 + 3 * t**2},
            "kl_climbing",
            "lower --learning-rate (now 5e-06) or raise --beta (now 0.02)",
        ),
        ({"entropy": lambda t: 1.0 - 0.95 * t}, "entropy_collapsed", "raise --temperature"),
        (
            {
                "rewards/format_reward/mean": lambda t: 0.05 + 0.15 * t,
                "rewards/correctness_reward/mean": lambda t: 0.3 - 0.25 * t,
            },
            "reward_hacking",
            "the policy learns the format, not the task",
        ),
        ({"reward": lambda t: 0.31}, "reward_flat", "raise --learning-rate"),
    ],
)
def test_each_problem_is_named_with_its_numbers_and_a_next_step(series, expected, words):
    findings = diagnose(history(**series), VALUES, set(FLAGS))
    assert expected in names(findings), findings
    text = str(next(f for f in findings if f.name == expected))
    assert words in text and "\n" not in text
    assert re.search(r"\d", text), "a finding carries the run's numbers"


def test_groups_that_all_earn_only_the_format_are_no_signal_even_when_trl_misses_them():
    """16 completions all paid 0.2: TRL logs reward_std 1.5e-8 and frac_reward_zero_std 0."""
    rows = history(
        reward=lambda t: 0.2,
        reward_std=lambda t: 1.539e-08,
        frac_reward_zero_std=lambda t: 0.0,
        **{"rewards/format_reward/mean": lambda t: 0.2, "rewards/correctness_reward/mean": lambda t: 0.0},
    )
    (finding,) = [f for f in diagnose(rows, VALUES, set(FLAGS)) if f.name == "no_learning_signal"]
    assert "completions earn the format and almost never the answer (correctness 0.000" in str(finding)
    assert "in 100% of groups" in str(finding)


def test_a_lucky_right_answer_does_not_turn_format_only_groups_into_groups_that_scored_nothing():
    """The README's CPU run: the format paid nearly always, one right answer in a few hundred."""
    rows = history(
        reward=lambda t: 0.19,
        frac_reward_zero_std=lambda t: 0.6,
        **{
            "rewards/format_reward/mean": lambda t: 0.19,
            "rewards/correctness_reward/mean": lambda t: 0.0625 if 0.5 < t < 0.52 else 0.0,
        },
    )
    (finding,) = [f for f in diagnose(rows, VALUES, set(FLAGS)) if f.name == "no_learning_signal"]
    assert "almost never the answer" in str(finding) and "scored nothing" not in str(finding)


def test_reward_hacking_is_caught_by_the_held_out_accuracy_too():
    rows = history(
        **{
            "rewards/format_reward/mean": lambda t: 0.05 + 0.15 * t,
            "rewards/correctness_reward/mean": lambda t: 0.2,
        }
    )
    before, after = EvalResult("base", 64, 0.30, 0.2, 100), EvalResult("adapter", 64, 0.10, 0.9, 40)
    findings = diagnose(rows, VALUES, set(FLAGS), before, after)
    assert "reward_hacking" in names(findings)
    assert "held-out accuracy 30.0% -> 10.0%" in str(findings[0]) or any(
        "held-out accuracy 30.0% -> 10.0%" in str(f) for f in findings
    )
    assert "reward_hacking" not in names(diagnose(rows, VALUES, set(FLAGS)))  # train correctness flat


def test_every_flag_a_finding_names_is_one_the_lab_accepts():
    everything = history(
        frac_reward_zero_std=lambda t: 1.0,
        reward=lambda t: 0.0,
        **{"completions/clipped_ratio": lambda t: 0.9, "kl": lambda t: 5 * t, "entropy": lambda t: 1 - t},
    )
    ap = parser("")
    text = " ".join(str(f) for f in diagnose(everything, VALUES, set(FLAGS)))
    flags = set(re.findall(r"--[a-z0-9-]+", text))
    assert flags
    for flag in flags:
        assert any(flag in action.option_strings for action in ap._actions), flag


def test_a_short_run_is_not_diagnosed():
    assert diagnose(history()[:3], VALUES, set(FLAGS)) == []


def test_a_run_too_short_to_read_says_so():
    from grpolab.doctor import step_rows

    rows = history()[:3]
    assert verdict(diagnose(rows, VALUES, set(FLAGS)), steps=len(step_rows(rows))).startswith(
        "Run doctor: 3 logged step(s) are too few"
    )
