"""The run doctor on logged histories built to show each problem, and on a healthy one."""

from __future__ import annotations

import dataclasses
import re

import pytest

import task
import task.rewards
from grpolab.config.settings import FLAGS, lab_settings
from grpolab.judging.doctor import diagnose, next_step, trends, verdict
from grpolab.judging.evaluate import EvalResult
from grpolab.lab.session import parser
from task.rewards import RewardRole, UndeclaredRewardError, completion_text, declare_reward

from suite import LAB_DIR

VALUES = {name: getattr(lab_settings(LAB_DIR, "gpu"), name) for name in FLAGS}
STEPS = 40


# Rewards no task has, declared the way the tasks declare theirs, for tasks built only here.
@declare_reward(0.5, RewardRole.SHAPING)
def reasoning_reward(prompts, completions, **kwargs) -> list[float]:
    """0.5 for a completion that shows its reasoning between <think> and </think>."""
    return [0.5 if "</think>" in completion_text(c) else 0.0 for c in completions]


@declare_reward(10.0, RewardRole.ANSWER)
def exact_reward(prompts, completions, target, **kwargs) -> list[float]:
    """10.0 for a completion that is exactly the target and nothing else."""
    return [
        10.0 if completion_text(c).strip() == str(t) else 0.0
        for c, t in zip(completions, target, strict=True)
    ]


THINKING = dataclasses.replace(
    task.ADDITION, name="addition-thinking", reward_funcs=(*task.ADDITION.reward_funcs, reasoning_reward)
)
RICH = dataclasses.replace(
    task.ADDITION, name="addition-rich", reward_funcs=(*task.ADDITION.reward_funcs, exact_reward)
)


@pytest.fixture
def registered(monkeypatch):
    """The test tasks in the registry, where the doctor looks up values["task"] as in a real run."""
    for t in (THINKING, RICH):
        monkeypatch.setitem(task.TASKS, t.name, t)
    return lambda t: {**VALUES, "task": t.name}


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
            "completions/distinct_share": 0.8,
            "completions/tag_like_ratio": 0.5 + 0.4 * t,
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
        # The book's reasons a correctness curve never moves, each with its next step.
        (
            {"completions/clipped_ratio": lambda t: 0.9, "rewards/format_reward/mean": lambda t: 0.01},
            "cut_before_the_tag",
            "raise --max-completion-length (now 768)",
        ),
        (
            {"completions/distinct_share": lambda t: 1 / 8, "frac_reward_zero_std": lambda t: 0.9},
            "no_diversity",
            "raise --temperature (now 1)",
        ),
        (
            {
                "rewards/format_reward/mean": lambda t: 0.0,
                "rewards/correctness_reward/mean": lambda t: 0.0,
                "completions/tag_like_ratio": lambda t: 0.3,
            },
            "reward_never_pays",
            "fix the parse",
        ),
    ],
)
def test_each_problem_is_named_with_its_numbers_and_a_next_step(series, expected, words):
    findings = diagnose(history(**series), VALUES, set(FLAGS))
    assert expected in names(findings), findings
    text = str(next(f for f in findings if f.name == expected))
    assert words in text and "\n" not in text
    assert re.search(r"\d", text), "a finding carries the run's numbers"


def test_a_cut_that_leaves_every_group_scoring_nothing_is_named_once_as_the_cut():
    """Chapter 8's cut arm: 2 tokens, no room for the tag, so every group scored 0. The cause is the
    cut; no_learning_signal (more generations, a higher temperature) would send the reader elsewhere."""
    rows = history(
        reward=lambda t: 0.0,
        frac_reward_zero_std=lambda t: 1.0,
        **{
            "completions/clipped_ratio": lambda t: 0.62,
            "rewards/format_reward/mean": lambda t: 0.0,
            "rewards/correctness_reward/mean": lambda t: 0.0,
            "completions/tag_like_ratio": lambda t: 0.0,
        },
    )
    assert names(diagnose(rows, {**VALUES, "max_completion_length": 2}, set(FLAGS))) == {"cut_before_the_tag"}


@pytest.mark.parametrize(
    ("series", "values", "expected", "printed", "step"),
    [
        # Chapter 8's arms: a length with no room for the tag, a group sampled at a temperature near 0.
        (
            {"completions/clipped_ratio": lambda t: 1.0, "rewards/format_reward/mean": lambda t: 0.0},
            {"max_completion_length": 2, "task": "lastdigit"},
            "cut_before_the_tag",
            "raise --max-completion-length (now 2) to >= 13",  # `<ans>7</ans>` and its end token
            {"max_completion_length": 13},
        ),
        (
            {"completions/clipped_ratio": lambda t: 1.0, "rewards/format_reward/mean": lambda t: 0.0},
            {"max_completion_length": 12, "task": "lastdigit"},
            "cut_before_the_tag",
            "raise --max-completion-length (now 12) to >= 24",  # twice, when that is more
            {"max_completion_length": 24},
        ),
        (
            {"completions/distinct_share": lambda t: 1 / 8, "frac_reward_zero_std": lambda t: 0.9},
            {"temperature": 0.05},
            "no_diversity",
            "raise --temperature (now 0.05) to >= 1",
            {"temperature": 1.0},
        ),
        # A policy that never left its start: held by the KL pull, or moved by steps too small.
        (
            {"kl": lambda t: 0.0026, "rewards/correctness_reward/mean": lambda t: 0.2 - 0.1 * t},
            {"beta": 5.0, "profile": "cpu"},
            "held_at_the_start",
            "the KL pull, beta 5, held it there: lower --beta (now 5) to <= 0.02",
            {"beta": 0.02},
        ),
        (
            {"kl": lambda t: 0.0003, "rewards/correctness_reward/mean": lambda t: 0.2},
            {"learning_rate": 7e-5, "profile": "cpu"},
            "held_at_the_start",
            "its steps were too small to move it: raise --learning-rate (now 7e-05) to >= 0.01",
            {"learning_rate": 0.01},
        ),
    ],
)
def test_the_next_step_a_finding_prints_is_the_one_a_program_applies(series, values, expected, printed, step):
    """Chapter 8 trains each fix as the doctor printed it: `next_step` reads the settings back from
    the finding's text, typed as the settings hold them."""
    from grpolab.judging.doctor import next_step

    settings = dataclasses.replace(lab_settings(LAB_DIR, "cpu"), **values)
    run_values = {**VALUES, **values}
    (finding,) = [f for f in diagnose(history(**series), run_values, set(FLAGS)) if f.name == expected]
    assert printed in finding.message, finding.message
    applied = next_step(finding, settings)
    assert applied == step and all(type(v) is type(step[k]) for k, v in applied.items())


def test_a_policy_that_moved_or_learned_is_not_held_at_the_start():
    """The rule reads KL with the learning: a small KL on a run whose answers climbed, or whose
    held-out accuracy rose, is a gentle run, not a stuck one; beta 0 logs no KL to read."""
    learned = history(kl=lambda t: 0.002)  # correctness 0.1 -> 0.6, and no held-out evaluation
    assert "held_at_the_start" not in names(diagnose(learned, {**VALUES, "beta": 5.0}, set(FLAGS)))
    same = (EvalResult("base", 64, 0.5, 1.0, 4.0), EvalResult("adapter", 64, 0.5, 1.0, 4.0))
    lucky = names(diagnose(learned, {**VALUES, "beta": 5.0}, set(FLAGS), *same))
    assert "held_at_the_start" in lucky, "held out, a climb this close to the start is a group's luck"
    flat = {"kl": lambda t: 0.002, "rewards/correctness_reward/mean": lambda t: 0.2}
    rose = (EvalResult("base", 64, 0.5, 1.0, 4.0), EvalResult("adapter", 64, 0.6, 1.0, 4.0))
    flipped = (EvalResult("base", 64, 0.734, 1.0, 4.0), EvalResult("adapter", 64, 0.75, 1.0, 4.0))
    one_prompt = names(diagnose(history(**flat), {**VALUES, "beta": 5.0}, set(FLAGS), *flipped))
    assert "held_at_the_start" in one_prompt, "one prompt of 64 flipped is not learning"
    assert "held_at_the_start" not in names(
        diagnose(history(**flat), {**VALUES, "beta": 5.0}, set(FLAGS), *rose)
    )
    assert "held_at_the_start" not in names(diagnose(history(**flat), {**VALUES, "beta": 0.0}, set(FLAGS)))
    found = names(diagnose(history(**flat), {**VALUES, "beta": 5.0}, set(FLAGS)))
    assert found == {"held_at_the_start"}, "named once, and not as a flat reward (a higher learning rate)"


def test_a_policy_held_at_the_start_is_not_read_as_learning_the_format():
    """Chapter 8's still arm at 14 steps (seed 0, 2026-12-08): KL 0.0000, held out 73.4% -> 73.4%,
    and its groups' luck moved the format reward up 0.083 -> 0.088 while correctness went 0.188 ->
    0.109. The first doctor named reward_hacking beside held_at_the_start, with the opposite step (a
    smaller learning rate): a policy that never left its start learned nothing, the format included."""
    still = {
        "kl": lambda t: 0.00002,
        "rewards/format_reward/mean": lambda t: 0.083 if t < 0.5 else 0.088,
        "rewards/correctness_reward/mean": lambda t: 0.188 if t < 0.5 else 0.109,
        "reward": lambda t: 0.271 if t < 0.5 else 0.197,
    }
    held = (EvalResult("base", 64, 0.734, 1.0, 4.0), EvalResult("adapter", 64, 0.734, 1.0, 4.0))
    values = {**VALUES, "learning_rate": 7e-5, "beta": 0.02, "profile": "cpu"}
    assert names(diagnose(history(**still), values, set(FLAGS), *held)) == {"held_at_the_start"}
    # The same trends on a policy that moved are what reward_hacking is for.
    moved = {**still, "kl": lambda t: 0.05}
    assert "reward_hacking" in names(diagnose(history(**moved), values, set(FLAGS), *held))


def test_a_next_step_with_no_value_is_refused_not_guessed():
    from grpolab.judging.doctor import Finding, next_step

    finding = Finding("reward_flat", "the reward stayed at 0.3: raise --learning-rate (now 0.007)")
    with pytest.raises(ValueError, match="names no setting with a value"):
        next_step(finding, lab_settings(LAB_DIR, "cpu"))


def test_advice_read_back_is_the_advice_rendered():
    from budgets.advice import lower, parse, raise_, render, set_to

    changes = (raise_("max_completion_length", 13), lower("learning_rate"), set_to("fast_inference", False))
    text = render(changes, {"max_completion_length": 2, "learning_rate": 7e-3, "fast_inference": True})
    assert text == (
        "raise --max-completion-length (now 2) to >= 13 or lower --learning-rate (now 0.007) "
        "or set --fast-inference false"
    )
    assert parse(f"cut: {text}, or penalise length") == (
        raise_("max_completion_length", "13"),
        lower("learning_rate"),
        set_to("fast_inference", "false"),
    )


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
    from grpolab.judging.doctor import step_rows

    rows = history()[:3]
    assert verdict(diagnose(rows, VALUES, set(FLAGS)), steps=len(step_rows(rows))).startswith(
        "Run doctor: 3 logged step(s) are too few"
    )


def test_a_new_shaping_reward_rising_while_correctness_falls_is_reward_hacking(registered):
    rows = history(
        **{
            "rewards/reasoning_reward/mean": lambda t: 0.5 * t,
            "rewards/format_reward/mean": lambda t: 0.2,
            "rewards/correctness_reward/mean": lambda t: 0.5 - 0.4 * t,
        }
    )
    (hack,) = [f for f in diagnose(rows, registered(THINKING), set(FLAGS)) if f.name == "reward_hacking"]
    text = str(hack)
    assert "rewards/reasoning_reward/mean rose 0.0" in text and "format_reward" not in text
    assert "rewards/correctness_reward/mean went 0.4" in text
    # The same rewards handed in directly, as a caller outside the lab would: the same verdict.
    by_funcs = diagnose(rows, VALUES, set(FLAGS), reward_funcs=THINKING.reward_funcs)
    assert [str(f) for f in by_funcs if f.name == "reward_hacking"] == [text]
    # Addition does not pay it: the doctor reports the reward unread instead of reasoning on it.
    under_addition = diagnose(rows, VALUES, set(FLAGS))
    assert "reward_hacking" not in names(under_addition)
    (unread,) = [f for f in under_addition if f.name == "undeclared_reward"]
    assert str(unread).startswith("undeclared_reward: rewards/reasoning_reward/mean logged")


def test_a_shaping_reward_rising_by_less_than_its_own_two_percent_is_not_hacking(registered):
    # 0.008 is more than 2% of format's 0.2 but less than 2% of reasoning's 0.5.
    rows = history(
        **{
            "rewards/reasoning_reward/mean": lambda t: 0.2 + 0.011 * t,
            "rewards/format_reward/mean": lambda t: 0.2,
            "rewards/correctness_reward/mean": lambda t: 0.5 - 0.4 * t,
        }
    )
    assert "reward_hacking" not in names(diagnose(rows, registered(THINKING), set(FLAGS)))


def test_the_flat_reward_rule_measures_against_the_tasks_own_maximum(registered):
    rows = history(reward=lambda t: 0.3 + 0.1 * t)  # quarters 0.31 -> 0.39: 6% of 1.2, under 1% of 11.2
    assert task.ADDITION.max_reward == pytest.approx(1.2) and RICH.max_reward == pytest.approx(11.2)
    assert "reward_flat" not in names(diagnose(rows, VALUES, set(FLAGS)))
    assert "reward_flat" in names(diagnose(rows, registered(RICH), set(FLAGS)))


def test_too_easy_is_measured_against_the_tasks_own_maximum(registered):
    rows = history(reward=lambda t: 1.15, frac_reward_zero_std=lambda t: 0.9)

    def why(values) -> str:
        (finding,) = [f for f in diagnose(rows, values, set(FLAGS)) if f.name == "no_learning_signal"]
        return str(finding)

    assert "the task is too easy" in why(VALUES)  # 1.15 of addition's 1.2
    assert "too easy" not in why(registered(RICH))  # 1.15 of 11.2


def test_a_rare_answer_is_measured_against_each_answer_rewards_maximum(registered):
    # exact_reward averages 0.05 of its 10.0 (0.5%): as rare as correctness's 0.0, though above 1% of 1.0.
    rows = history(
        reward=lambda t: 0.25,
        frac_reward_zero_std=lambda t: 0.6,
        **{
            "rewards/format_reward/mean": lambda t: 0.2,
            "rewards/correctness_reward/mean": lambda t: 0.0,
            "rewards/exact_reward/mean": lambda t: 0.05,
        },
    )
    (finding,) = [f for f in diagnose(rows, registered(RICH), set(FLAGS)) if f.name == "no_learning_signal"]
    assert (
        "almost never the answer (correctness 0.000, 0.050 on average in "
        "rewards/correctness_reward/mean, rewards/exact_reward/mean)" in str(finding)
    )
    paid_often = [{**row, "rewards/exact_reward/mean": 2.0} for row in rows]  # 20% of its maximum
    (finding,) = [
        f for f in diagnose(paid_often, registered(RICH), set(FLAGS)) if f.name == "no_learning_signal"
    ]
    assert "almost never the answer" not in str(finding)


def test_the_doctor_fails_loudly_without_the_runs_task():
    partial = {k: v for k, v in VALUES.items() if k != "task"}
    with pytest.raises(ValueError, match=r"values\['task'\]"):
        diagnose(history(), partial, set(FLAGS))
    with pytest.raises(ValueError, match=r"values\['task'\]"):
        diagnose(history()[:2], partial, set(FLAGS))  # a short run too: the call is wrong, not the run
    assert diagnose(history(), partial, set(FLAGS), reward_funcs=task.ADDITION.reward_funcs) == []
    with pytest.raises(task.UnknownTaskError):
        diagnose(history(), {**VALUES, "task": "no-such-task"}, set(FLAGS))


def test_an_undeclared_reward_function_is_refused():
    def bare_reward(prompts, completions, **kwargs) -> list[float]:
        return [0.0 for _ in completions]

    with pytest.raises(UndeclaredRewardError, match="bare_reward"):
        diagnose(history(), VALUES, set(FLAGS), reward_funcs=(*task.ADDITION.reward_funcs, bare_reward))


def test_an_answer_reward_rising_is_not_a_shaping_reward_rising(registered):
    # Roles, not names, decide: exact_reward is an answer reward, so its rise is learning, not a hack.
    rows = history(
        **{
            "rewards/exact_reward/mean": lambda t: 4.0 * t,
            "rewards/format_reward/mean": lambda t: 0.2,
            "rewards/correctness_reward/mean": lambda t: 0.5 - 0.4 * t,
        }
    )
    assert "reward_hacking" not in names(diagnose(rows, registered(RICH), set(FLAGS)))


# --- chapter 4: a proxy reward trained, the task's exact reward watched at weight 0 ------------------
LOOSE_RUN = {**VALUES, "task": "lastdigit"}


def _loose_rewards():
    from task.loose import contains_answer_reward

    return (contains_answer_reward, *task.LASTDIGIT.reward_funcs), [1.0, 0.0, 0.0]


def proxy_history(proxy, exact, steps: int = STEPS) -> list[dict[str, float]]:
    """The loose arm's logs: the proxy's and the task's exact reward on the same completions, per step."""
    rows = history(
        **{
            "rewards/contains_answer_reward/mean": proxy,
            "rewards/correctness_reward/mean": exact,
            "rewards/format_reward/mean": lambda t: 0.1,
            "reward": proxy,
        }
    )
    return rows[:steps]


def test_a_proxy_climbing_away_from_the_exact_reward_is_hacking_named_at_the_step_it_began():
    funcs, weights = _loose_rewards()
    # The two move together for the first 15 steps (of 40), then the proxy climbs alone.
    start = 15 / (STEPS - 1)
    rows = proxy_history(
        lambda t: 0.2 + (0.75 * (t - start) / (1 - start) if t > start else 0.0), lambda t: 0.2
    )
    before, after = EvalResult("base", 64, 0.2, 0.3, 6.0), EvalResult("adapter", 64, 0.05, 0.1, 9.0)
    findings = diagnose(
        rows, LOOSE_RUN, set(FLAGS), before, after, reward_funcs=funcs, reward_weights=weights
    )
    (hack,) = [f for f in findings if f.name == "reward_hacking"]
    step = int(re.search(r"from step (\d+)", str(hack)).group(1))
    assert 16 <= step <= 24, str(hack)  # the climb starts after step 16; the doctor sees it within a few
    assert "rewards/contains_answer_reward/mean rose 0.200" in str(hack)
    assert "rewards/correctness_reward/mean, went 0.200 -> 0.200" in str(hack)
    assert "held-out accuracy went 20.0% -> 5.0%" in str(hack)
    assert "train on the task's own correctness_reward" in str(hack)
    # The watched rewards pay nothing: the run's maximum is the proxy's alone, so no "flat" finding.
    assert "reward_flat" not in names(findings)


def test_a_proxy_rising_with_the_exact_reward_is_not_hacking():
    funcs, weights = _loose_rewards()
    rows = proxy_history(lambda t: 0.2 + 0.7 * t, lambda t: 0.15 + 0.7 * t)  # it pays right answers
    before, after = EvalResult("base", 64, 0.2, 0.3, 6.0), EvalResult("adapter", 64, 0.8, 0.9, 5.0)
    findings = diagnose(
        rows, LOOSE_RUN, set(FLAGS), before, after, reward_funcs=funcs, reward_weights=weights
    )
    assert "reward_hacking" not in names(findings)


def test_a_proxy_nobody_watched_is_judged_by_the_held_out_accuracy():
    from task.loose import contains_answer_reward

    rows = [
        {k: v for k, v in row.items() if k != "rewards/correctness_reward/mean"}
        for row in proxy_history(lambda t: 0.2 + 0.7 * t, lambda t: 0.0)
    ]
    funcs = (contains_answer_reward, task.LASTDIGIT.reward_funcs[1])
    flat = EvalResult("base", 64, 0.2, 0.3, 6.0), EvalResult("adapter", 64, 0.2, 0.9, 9.0)
    rose = EvalResult("base", 64, 0.2, 0.3, 6.0), EvalResult("adapter", 64, 0.6, 0.9, 5.0)
    assert "reward_hacking" in names(diagnose(rows, LOOSE_RUN, set(FLAGS), *flat, reward_funcs=funcs))
    assert "reward_hacking" not in names(diagnose(rows, LOOSE_RUN, set(FLAGS), *rose, reward_funcs=funcs))
    assert "reward_hacking" not in names(
        diagnose(rows, LOOSE_RUN, set(FLAGS), reward_funcs=funcs)
    )  # no evidence


def test_the_honest_arm_trained_on_the_tasks_own_rewards_is_not_hacking():
    rows = history()  # correctness and format rising together
    before, after = EvalResult("base", 64, 0.2, 0.3, 6.0), EvalResult("adapter", 64, 0.6, 0.9, 5.0)
    findings = diagnose(
        rows,
        LOOSE_RUN,
        set(FLAGS),
        before,
        after,
        reward_funcs=task.LASTDIGIT.reward_funcs,
        reward_weights=[1, 1],
    )
    assert "reward_hacking" not in names(findings)


def test_reward_weights_must_match_the_rewards():
    funcs, _ = _loose_rewards()
    with pytest.raises(ValueError, match="2 reward weights for 3 rewards"):
        diagnose(history(), LOOSE_RUN, set(FLAGS), reward_funcs=funcs, reward_weights=[1, 0])


def test_a_proxy_that_holds_while_the_exact_reward_falls_is_hacking_too():
    """Measured on the stand-in: the loose checker kept paying while the policy dropped the tag."""
    funcs, weights = _loose_rewards()
    rows = proxy_history(lambda t: 0.9, lambda t: 0.8 - 0.7 * t)
    findings = diagnose(rows, LOOSE_RUN, set(FLAGS), reward_funcs=funcs, reward_weights=weights)
    (hack,) = [f for f in findings if f.name == "reward_hacking"]
    assert "rewards/contains_answer_reward/mean held 0.900 -> 0.900" in str(hack)
    assert "reward_hacking" not in names(
        diagnose(
            proxy_history(lambda t: 0.9 - 0.5 * t, lambda t: 0.8 - 0.7 * t),
            LOOSE_RUN,
            set(FLAGS),
            reward_funcs=funcs,
            reward_weights=weights,
        )
    ), "a proxy that fell with it is a run that got worse, not a hack"


# --- the book's four culprits, each beside what looks like it and is not ---------------------------
def test_cut_after_the_answer_is_not_cut_before_the_tag():
    """Completions cut at the cap while the format is paid: they ramble after the answer, which is
    `completions_cut` (penalise length), not the tag never coming."""
    found = names(diagnose(history(**{"completions/clipped_ratio": lambda t: 0.6}), VALUES, set(FLAGS)))
    assert "completions_cut" in found and "cut_before_the_tag" not in found


def test_no_diversity_names_the_temperature_and_not_the_groups():
    """Identical completions are the one reason their groups teach nothing: one finding, not two."""
    rows = history(
        **{
            "completions/distinct_share": lambda t: 1 / 16,
            "frac_reward_zero_std": lambda t: 1.0,
            "reward": lambda t: 0.0,
        }
    )
    found = names(diagnose(rows, {**VALUES, "num_generations": 16, "temperature": 0.05}, set(FLAGS)))
    assert "no_diversity" in found and "no_learning_signal" not in found
    (finding,) = [
        f
        for f in diagnose(rows, {**VALUES, "num_generations": 16, "temperature": 0.05}, set(FLAGS))
        if f.name == "no_diversity"
    ]
    assert "a group of 16 held about 1.0 distinct completions" in str(finding) and "(now 0.05)" in str(
        finding
    )


def test_a_confident_model_that_samples_few_distinct_answers_still_has_diversity():
    """The CPU stand-in writes 2 or 3 distinct answers of 16 for a sum it knows: groups still differ."""
    rows = history(**{"completions/distinct_share": lambda t: 2.5 / 16})
    assert "no_diversity" not in names(diagnose(rows, {**VALUES, "num_generations": 16}, set(FLAGS)))


def test_a_short_run_whose_first_group_was_one_completion_by_chance_has_diversity():
    """Six steps of one group each: the first quarter is one group, and a confident model's one group
    can be one answer repeated. The rule reads the first four steps at least (measured: the stand-in
    writes 1 to 6 distinct of 16 a step at temperature 1, and 1 at 0.05)."""
    per_step = [1, 3, 4, 3, 2, 4]
    rows = [
        {**row, "completions/distinct_share": n / 16} for row, n in zip(history()[:6], per_step, strict=True)
    ]
    assert "no_diversity" not in names(diagnose(rows, {**VALUES, "num_generations": 16}, set(FLAGS)))
    cold = [{**row, "completions/distinct_share": 1 / 16} for row in rows]
    assert "no_diversity" in names(diagnose(cold, {**VALUES, "num_generations": 16}, set(FLAGS)))


def test_completions_cut_to_a_few_tokens_are_named_cut_not_short_of_diversity():
    """Completions of two tokens cannot differ much: the cut is the culprit, named alone."""
    rows = history(
        **{
            "completions/clipped_ratio": lambda t: 1.0,
            "rewards/format_reward/mean": lambda t: 0.0,
            "completions/distinct_share": lambda t: 1 / 16,
        }
    )
    found = names(diagnose(rows, {**VALUES, "num_generations": 16}, set(FLAGS)))
    assert "cut_before_the_tag" in found and "no_diversity" not in found


def test_a_policy_that_converged_after_learning_is_not_short_of_diversity():
    """Groups that end alike because the policy learned the answer: late, with the reward up."""
    rows = history(**{"completions/distinct_share": lambda t: 0.9 if t < 0.6 else 0.1})
    assert "no_diversity" not in names(diagnose(rows, VALUES, set(FLAGS)))


def test_a_reward_that_never_pays_is_a_parse_only_when_answers_were_written():
    """Zeros from a model that never writes the tag are no_learning_signal's business, not a parse's."""
    silent = {"rewards/format_reward/mean": lambda t: 0.0, "rewards/correctness_reward/mean": lambda t: 0.0}
    untagged = history(**silent, **{"completions/tag_like_ratio": lambda t: 0.0})
    assert "reward_never_pays" not in names(diagnose(untagged, VALUES, set(FLAGS)))
    tagged = history(**silent, **{"completions/tag_like_ratio": lambda t: 0.1})
    (finding,) = [f for f in diagnose(tagged, VALUES, set(FLAGS)) if f.name == "reward_never_pays"]
    assert "correctness_reward, format_reward paid nothing in 40 steps while 10% of completions" in str(
        finding
    )


GAP = "sampling/sampling_logp_difference/mean"


@pytest.mark.parametrize(
    ("case", "gap", "fires"),
    [
        # The adapter reaches vLLM: both compute the same policy; kernels keep them a few hundredths apart
        # while the policy moves far from the base (KL below).
        ("adapter in vLLM", lambda t: 0.02 + 0.005 * (t * 7 % 1), False),
        # vLLM serves the base while the adapter trains: the gap grows with the adapter's distance.
        ("base served", lambda t: 0.01 + 0.6 * t, True),
        # One step's outlier (a rare token): a spike, not a drift.
        ("one spike", lambda t: 0.9 if 0.5 < t < 0.53 else 0.02, False),
        # A gap large from the first step (another model altogether), not growing: not this rule's shape.
        ("large from the start", lambda t: 0.5, False),
    ],
)
def test_rollouts_not_from_the_policy_on_metrics_shaped_like_each_case(case, gap, fires):
    """GPU-only (vLLM's log-probs): logged metrics shaped like each case, with the KL to the base rising."""
    rows = history(**{GAP: gap, "kl": lambda t: 0.02 + 0.5 * t})
    found = [f for f in diagnose(rows, VALUES, set(FLAGS)) if f.name == "rollouts_not_from_policy"]
    assert bool(found) == fires, (case, found)
    if fires:
        assert "the rollouts do not come from the adapter being trained" in str(found[0])
        assert "set --fast-inference false" in str(found[0])


def test_on_the_cpus_reproduction_the_next_step_turns_the_adapter_back_on():
    """Chapter 8's unsynced arm (rollout_adapter false, grpolab.model.rollouts) logs the same gap on the
    CPU; its next step is the setting that broke it, as a value next_step applies, not vLLM's advice."""
    rows = history(**{GAP: lambda t: 0.01 + 0.6 * t, "kl": lambda t: 0.02 + 0.5 * t})
    values = {**VALUES, "rollout_adapter": False, "fast_inference": False}
    (found,) = [f for f in diagnose(rows, values, set(FLAGS)) if f.name == "rollouts_not_from_policy"]
    assert "the rollouts come from the base, with the adapter being trained disabled" in str(found)
    assert "set --rollout-adapter true" in str(found) and "vLLM" not in str(found)
    assert next_step(found, lab_settings(LAB_DIR, "cpu").replace(rollout_adapter=False)) == {
        "rollout_adapter": True
    }


def test_a_flat_reward_that_unsynced_rollouts_explain_is_not_named_twice():
    """Rollouts from the base score the base: the reward stays flat, which more steps do not cure."""
    flat = {"reward": lambda t: 0.6, "rewards/correctness_reward/mean": lambda t: 0.5}
    rows = history(**flat, **{GAP: lambda t: 0.01 + 0.6 * t, "kl": lambda t: 0.02 + 0.5 * t})
    values = {**VALUES, "rollout_adapter": False}
    assert names(diagnose(rows, values, set(FLAGS))) == {"rollouts_not_from_policy"}


def test_a_kl_measured_on_rollouts_from_another_policy_is_not_named_as_drift():
    """TRL's KL is estimated on the rollouts; from the base, it is not the adapter's drift, and its
    step (a smaller learning rate) mends nothing. Without the gap the same KL is named."""
    kl = {"kl": lambda t: 0.1 + 3.0 * t}
    assert "kl_climbing" in names(diagnose(history(**kl), VALUES, set(FLAGS)))
    served = history(**kl, **{GAP: lambda t: 0.01 + 1.6 * t})
    assert names(diagnose(served, VALUES, set(FLAGS))) == {"rollouts_not_from_policy"}


def test_rewards_scored_on_another_policys_rollouts_are_not_read_as_hacking():
    """Chapter 8's unsynced arm, seed 3: the base's format reward wandered up while the answer reward
    did not and held-out accuracy fell; the rollouts were the base's, so their rewards say nothing of
    what the adapter learned. Without the gap the same curves are named reward_hacking."""
    hacked = {
        "rewards/format_reward/mean": lambda t: 0.088 + 0.04 * t,
        "rewards/correctness_reward/mean": lambda t: 0.14 - 0.06 * t,
    }
    before, after = EvalResult("base", 64, 0.734, 1.0, 4.1), EvalResult("adapter", 64, 0.641, 1.0, 4.0)
    rows = history(**hacked)
    assert "reward_hacking" in names(diagnose(rows, VALUES, set(FLAGS), before, after))
    served = history(**hacked, **{GAP: lambda t: 0.01 + 1.6 * t})
    assert names(diagnose(served, VALUES, set(FLAGS), before, after)) == {"rollouts_not_from_policy"}


def test_without_vllms_log_probs_the_rule_stays_quiet():
    """The CPU stand-in has no vLLM, and a GPU run without the correction logs no gap: no finding."""
    assert "rollouts_not_from_policy" not in names(diagnose(history(), VALUES, set(FLAGS)))


# --- chapter 8's mistagged arm: open-r1's <answer> parse paid, the task's own watched at weight 0 -------
def _mistagged_rewards():
    from task.mistagged import answer_tag_reward

    return (answer_tag_reward, *reversed(task.LASTDIGIT.reward_funcs)), [1.0, 1.0, 0.0]


def mistagged_history(own=lambda t: 0.25) -> list[dict[str, float]]:
    """The arm's logs, as its README run logged them: the paid parse at zero, the format learned, the
    task's own correctness (watched) paying now and then, answers in the prompt's tag."""
    return history(
        **{
            "rewards/answer_tag_reward/mean": lambda t: 0.0,
            "rewards/format_reward/mean": lambda t: 0.11 + 0.09 * t,
            "rewards/correctness_reward/mean": own,
            "reward": lambda t: 0.11 + 0.09 * t,
            "frac_reward_zero_std": lambda t: 0.2 + 0.7 * t,  # the format learned, groups alike
            "completions/tag_like_ratio": lambda t: 0.85,
            "kl": lambda t: 0.1 * t,
        }
    )


def test_a_foreign_parse_that_never_pays_is_named_alone_with_the_tasks_own_reward_to_pay_instead():
    """Paid for the format alone, the policy learns it while held-out accuracy falls: the parse's doing,
    not a hack, and the step is to pay the task's own answer reward (chapter 8's mistagged arm, on
    its README run, was also named reward_hacking, whose step mends nothing)."""
    from grpolab.judging.doctor import reward_swap

    funcs, weights = _mistagged_rewards()
    before, after = EvalResult("base", 64, 0.734, 1.0, 4.1), EvalResult("adapter", 64, 0.609, 1.0, 4.0)
    findings = diagnose(
        mistagged_history(), LOOSE_RUN, set(FLAGS), before, after, reward_funcs=funcs, reward_weights=weights
    )
    assert names(findings) == {"reward_never_pays"}, findings
    (finding,) = findings
    assert "pay the task's own correctness_reward in place of answer_tag_reward (it paid 0.250" in str(
        finding
    )
    assert reward_swap(finding) == ("answer_tag_reward", "correctness_reward")


def test_no_swap_when_the_tasks_own_answer_reward_paid_nothing_either():
    """The model may never be right: the step stays the parse to check by hand. The task's own
    correctness is not named: its format, parsed by the same parse_answer, paid."""
    from grpolab.judging.doctor import reward_swap

    funcs, weights = _mistagged_rewards()
    rows = mistagged_history(own=lambda t: 0.0)
    findings = diagnose(rows, LOOSE_RUN, set(FLAGS), reward_funcs=funcs, reward_weights=weights)
    (finding,) = [f for f in findings if f.name == "reward_never_pays"]
    assert str(finding).startswith("reward_never_pays: answer_tag_reward paid nothing in 40 steps")
    assert reward_swap(finding) is None and "fix the parse or what the prompt asks for" in str(finding)


def test_a_format_rising_beside_an_answer_reward_that_pays_is_still_hacking():
    """The hack is set aside only when every answer reward the run was paid stayed at zero."""
    funcs, weights = _mistagged_rewards()
    rows = history(
        **{
            "rewards/answer_tag_reward/mean": lambda t: 0.3 - 0.2 * t,
            "rewards/format_reward/mean": lambda t: 0.05 + 0.15 * t,
            "rewards/correctness_reward/mean": lambda t: 0.25,
            "completions/tag_like_ratio": lambda t: 0.85,
        }
    )
    findings = diagnose(rows, LOOSE_RUN, set(FLAGS), reward_funcs=funcs, reward_weights=weights)
    assert "reward_hacking" in names(findings) and "reward_never_pays" not in names(findings)


def test_the_verdict_says_how_each_paid_reward_moved():
    """The curves a reader checks first, in the verdict: each paid reward, first -> last quarter."""
    rows = history()

    def mean(f, steps):  # the history's own formula, averaged over a quarter's steps
        return sum(f(i / (STEPS - 1)) for i in steps) / len(steps)

    first, last = range(0, STEPS // 4), range(3 * STEPS // 4, STEPS)
    right, tag = (lambda t: 0.1 + 0.5 * t), (lambda t: 0.1 + 0.1 * t)
    curves = trends(rows, VALUES)
    assert curves == (
        f"correctness_reward {mean(right, first):.3f} -> {mean(right, last):.3f}, "
        f"format_reward {mean(tag, first):.3f} -> {mean(tag, last):.3f} (first -> last quarter of 40 steps)"
    )
    before, after = EvalResult("base", 64, 0.0, 0.0, 3.0), EvalResult("adapter", 64, 0.56, 0.95, 5.0)
    text = verdict([], before, after, steps=len(rows), curves=curves)
    assert text.startswith(f"Run doctor: nothing held learning back. Rewards: {curves}.")
    assert text.endswith("Held-out accuracy 0.0% -> 56.0%, format 0.0% -> 95.0% (base -> adapter).")
    # A reward watched at weight 0 (chapter 4's) is not a curve the policy was paid on.
    assert "format_reward" not in trends(rows, VALUES, reward_weights=[1.0, 0.0])


LASTDIGIT = {**VALUES, "task": "lastdigit"}


def test_a_task_already_solved_gets_the_next_harder_question_as_its_step():
    """Every group all right (chapter 8's solved arm): the step is the task's next question up, as a
    flag the lab takes, quoted as a shell takes it and read back whole."""
    rows = history(
        reward=lambda t: 1.19,
        frac_reward_zero_std=lambda t: 0.95,
        **{"rewards/format_reward/mean": lambda t: 0.2, "rewards/correctness_reward/mean": lambda t: 0.99},
    )
    values = {**LASTDIGIT, "task_config": '{"ask": "first_digit"}'}
    (finding,) = [f for f in diagnose(rows, values, set(FLAGS)) if f.name == "no_learning_signal"]
    assert "too easy for the policy" in str(finding)
    assert "set --task-config '{}' (a harder question of the same task)" in str(finding)
    assert next_step(finding, lab_settings(LAB_DIR, "cpu")) == {"task_config": "{}"}
    # The top of the ladder has no harder question: the step names none, and none is applied.
    (top,) = diagnose(rows, {**LASTDIGIT, "task_config": '{"ask": "digit_sum"}'}, set(FLAGS))
    assert "pick a harder task with --task" in str(top) and "--task-config" not in str(top)


def test_an_answer_never_paid_is_no_signal_even_while_the_format_still_differs_in_each_group():
    """Chapter 8's unreachable arm: the format differs within groups (TRL's frac_reward_zero_std near
    0), the answer almost never comes: no group has a right answer to learn from. The step is the
    task's next question down; a task with no ladder gets more generations, or an easier task."""
    rows = history(
        reward=lambda t: 0.1 + 0.08 * t,
        frac_reward_zero_std=lambda t: 0.05,
        **{
            "rewards/format_reward/mean": lambda t: 0.1 + 0.08 * t,
            "rewards/correctness_reward/mean": lambda t: 0.004 if t > 0.5 else 0.0,
        },
    )
    values = {**LASTDIGIT, "task_config": '{"ask": "digit_sum"}'}
    found = diagnose(rows, values, set(FLAGS))
    assert names(found) == {"no_learning_signal"}, found
    assert "out of the policy's reach: set --task-config '{}' (an easier question" in str(found[0])
    assert next_step(found[0], lab_settings(LAB_DIR, "cpu")) == {"task_config": "{}"}
    (plain,) = diagnose(rows, VALUES, set(FLAGS))
    assert "raise --num-generations" in str(plain) and plain.message.endswith(", or an easier task")
    # One right answer in fifty is signal enough: not named.
    rows = history(
        reward=lambda t: 0.2,
        frac_reward_zero_std=lambda t: 0.05,
        **{"rewards/format_reward/mean": lambda t: 0.18, "rewards/correctness_reward/mean": lambda t: 0.02},
    )
    assert "no_learning_signal" not in names(diagnose(rows, values, set(FLAGS)))


def test_groups_of_one_right_completion_repeated_are_a_solved_task_not_a_cold_temperature():
    """A policy sure of the right answer samples it again and again at temperature 1.0: the groups have
    no spread, as a cold temperature's, but a warmer temperature mends nothing (chapter 8's solved arm).
    The same groups paid little are named no_diversity, as before."""
    solved = history(
        reward=lambda t: 1.2,
        frac_reward_zero_std=lambda t: 1.0,
        **{"completions/distinct_share": lambda t: 1 / 8, "rewards/correctness_reward/mean": lambda t: 1.0},
    )
    values = {**LASTDIGIT, "task_config": '{"ask": "first_digit"}', "num_generations": 8, "temperature": 1.0}
    assert names(diagnose(solved, values, set(FLAGS))) == {"no_learning_signal"}
    cold = history(
        reward=lambda t: 0.6,
        **{"completions/distinct_share": lambda t: 1 / 8},
        frac_reward_zero_std=lambda t: 1.0,
    )
    assert "no_diversity" in names(diagnose(cold, {**values, "temperature": 0.05}, set(FLAGS)))
    # Cold groups that happen to be right at first are still cold: a warmer temperature is the step
    # (chapter 8's cold arm, seed 1: its first 8 prompts answered right at 0.05, half its later ones).
    lucky = history(
        reward=lambda t: 1.2 if t < STEPS // 4 else 0.7,
        frac_reward_zero_std=lambda t: 1.0,
        **{"completions/distinct_share": lambda t: 1 / 8, "rewards/correctness_reward/mean": lambda t: 0.8},
    )
    found = diagnose(lucky, {**values, "temperature": 0.05}, set(FLAGS))
    assert names(found) == {"no_diversity"}, found
