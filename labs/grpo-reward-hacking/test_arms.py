"""The arms' report (grpolab.chapters.arms) on records built here, and the refusals before anything loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpolab.chapters import arms

from suite import load_lab_module

LAB = Path(__file__).resolve().parent


def record(name: str, paid: list[float], exact: list[float], kl: list[float], findings: list[str]) -> dict:
    return {
        "arm": name,
        "reward": "loose" if name.startswith("loose") else "exact",
        "run_id": f"id-{name}",
        "beta": 0.0 if not kl else 0.02,
        "loss_type": "dr_grpo",
        "paid_metric": "rewards/contains_answer_reward/mean"
        if name.startswith("loose")
        else "rewards/correctness_reward/mean",
        "exact_metric": "rewards/correctness_reward/mean",
        "steps": list(range(1, len(paid) + 1)),
        "paid": paid,
        "exact": exact,
        "kl": kl,
        "held_out": {
            "base": {"accuracy": 0.25, "format_rate": 0.3, "rewards": {"contains_answer_reward": 0.3}},
            "adapter": {"accuracy": 0.1, "format_rate": 0.9, "rewards": {"contains_answer_reward": 0.9}},
        },
        "questions": ["What is the last digit of 827?", "What is the last digit of 1|2?"],
        "completions": {"base": ["<ans>7</ans>", "a|b"], "adapter": ["<ans>827</ans>", "x\ny"]},
        "findings": findings,
        "finding_names": sorted({f.split(":")[0] for f in findings}),
    }


RECORDS = [
    record("exact", [0.2, 0.3, 0.5, 0.7], [0.2, 0.3, 0.5, 0.7], [0.0, 0.1, 0.2, 0.2], []),
    record(
        "loose",
        [0.2, 0.5, 0.8, 0.9],
        [0.2, 0.2, 0.1, 0.1],
        [0.0, 0.3, 0.5, 0.6],
        ["reward_hacking: from step 2 ..."],
    ),
    record(
        "loose-beta0", [0.2, 0.6, 0.9, 1.0], [0.2, 0.1, 0.0, 0.0], [], ["reward_hacking: from step 2 ..."]
    ),
]


def test_the_verdict_has_a_line_per_arm_with_its_numbers_and_findings():
    text = arms.verdict(RECORDS)
    lines = text.splitlines()
    assert len(lines) == 3
    assert (
        lines[0].startswith("- **exact** (exact reward, beta 0.02)")
        and "The doctor found nothing" in lines[0]
    )
    assert "held-out accuracy 25.0% -> 10.0%" in lines[1] and "reward_hacking: from step 2" in lines[1]
    assert "KL not measured (beta 0: no reference policy)" in lines[2]


def test_the_completions_sit_side_by_side_and_cannot_break_the_table():
    table = arms.completions_table(RECORDS[:1])
    assert (
        table.splitlines()[2]
        == "| exact | What is the last digit of 827? | `<ans>7</ans>` | `<ans>827</ans>` |"
    )
    assert "1\\|2? | `a\\|b` | `x\\ny`" in table


def test_the_chart_draws_paid_exact_and_held_out_per_arm_and_kl_beside():
    fig = arms.chart(RECORDS)
    top, bottom = fig.axes  # paid vs exact above, KL below
    labels = [line.get_label() for line in top.get_lines()]
    assert "loose: exact, same completions" in labels and "exact: held-out accuracy" in labels
    assert "exact: exact, same completions" not in labels  # the exact arm is paid by the exact reward
    assert len(bottom.get_lines()) == 2  # beta 0 logs no KL


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--arms", "exact,nope"], "--arms: unknown arm nope; known: exact, loose"),
        (["--arms", ","], "--arms: unknown arm (none)"),
        (["--resume", "last"], "--resume: the arms are compared from the same start"),
    ],
)
def test_an_unknown_arm_is_refused_in_one_line_before_anything_loads(
    argv, words, capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    lab = load_lab_module(LAB)
    assert lab.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {words}") and err.count("\n") == 1
    assert not (tmp_path / "mlflow.db").exists()


def test_the_lessons_rewards_pay_one_arm_each_and_watch_the_rest():
    import task

    lab = load_lab_module(LAB)
    names = lambda funcs: [f.__name__ for f in funcs]  # noqa: E731
    funcs, weights = lab.rewards(task.LASTDIGIT, "exact")
    assert (names(funcs), weights) == (
        ["correctness_reward", "format_reward", "contains_answer_reward"],
        [1.0, 1.0, 0.0],
    )
    funcs, weights = lab.rewards(task.LASTDIGIT, "loose")
    assert (names(funcs), weights) == (
        ["contains_answer_reward", "correctness_reward", "format_reward"],
        [1.0, 0.0, 0.0],
    )
    with pytest.raises(ValueError, match="unknown reward"):
        lab.rewards(task.LASTDIGIT, "other")
