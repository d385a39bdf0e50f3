"""Chapter 8: when the reward won't move, each cause reproduced, named by the doctor, and mended by what it says.

"My reward is flat" is the question GRPO users ask most. The run doctor (grpolab/judging/doctor.py)
reads every run's curves and names what held learning back, with one next step as flags. This
chapter breaks the book's run one way an arm, the way users break it, and shows each cause happen:

    cut        max_completion_length 2: every completion is cut before its answer's tag closes
    cold       temperature 0.05: the group samples one completion, repeated, so none beats its group
    still      learning_rate 7e-5: a step too small to move the adapter off the base
    leashed    beta 5: a KL pull that holds the policy at the reference
    mistagged  paid by open-r1's `<answer>` parse on a prompt that asks for `<ans>`: it never pays
    solved     asked the first digit, which the model already gets right in every completion
    unreachable  asked the sum of the digits, which the model never gets right: no group holds an answer
    unsynced   rollouts sampled from the base while the adapter trains (on a GPU: the LoRA weights
               never reach vLLM; here the trainer's own generation, its adapter disabled)

After each broken arm the doctor's finding is read back, and the next step it printed (`raise
--max-completion-length (now 2) to >= 13`) is parsed from its text (grpolab.judging.doctor.next_step)
and trained as arm `<cause>-fixed`: the mend is what the doctor said, never a second copy written
here (for the mistagged arm, the reward it said to pay in place of the silent one:
grpolab.judging.doctor.reward_swap). Each arm is a run nested under one MLflow run, whose Overview tables cause, finding, fix and
held-out accuracy before and after.

What it simplifies: short arms (14 steps on the CPU), one process for all arms (an arm's memory peak
includes what earlier ones left), chapter 4's task (lastdigit), whose stand-in knows the task now and
then. On a GPU, Qwen3-4B with the book's recipe on countdown.

Usage:
    uv run python labs/grpo-stuck/train.py                          # every cause, broken then fixed
    uv run python labs/grpo-stuck/train.py --arms cold              # one cause
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db        # the chapter's run, its arms under it
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpolab
from grpolab.chapters import load_chapter
from grpolab.chapters.arms import Arm
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent
FIRST = load_chapter("grpo-first")  # chapter 1's lesson: every arm trains it

# --- The causes: what each arm breaks, and the finding the doctor must name ------------------------
FIRST_DIGIT, DIGIT_SUM = '{"ask": "first_digit"}', '{"ask": "digit_sum"}'
ARMS = (
    Arm("cut", "task", {"max_completion_length": 2}, cause="cut_before_the_tag"),
    Arm("cold", "task", {"temperature": 0.05}, cause="no_diversity"),
    Arm("still", "task", {"learning_rate": 7e-5}, cause="held_at_the_start"),
    Arm("leashed", "task", {"beta": 5.0}, cause="held_at_the_start"),
    Arm("mistagged", "answer_tag_reward+format_reward", cause="reward_never_pays"),
    # No signal: every group scores the same. Two other questions of chapter 4's task (its config,
    # task.lastdigit.ASKS): the first digit, which the model answers right every time, and the sum of
    # the digits, which it never adds up. The doctor's step is the task's next question down or up.
    # The task is named: on a GPU the chapter trains countdown, which takes no config.
    Arm("solved", "task", {"task": "lastdigit", "task_config": FIRST_DIGIT}, cause="no_learning_signal"),
    Arm("unreachable", "task", {"task": "lastdigit", "task_config": DIGIT_SUM}, cause="no_learning_signal"),
    # The trainer's own generation, broken: on a GPU too, where vLLM would otherwise sample.
    Arm(
        "unsynced",
        "task",
        {"rollout_adapter": False, "fast_inference": False},
        cause="rollouts_not_from_policy",
    ),
)


def rewards(task, key: str) -> tuple[list, list[float] | None]:
    """The reward functions an arm's trainer gets, and their weights. `task`: the task's own, all paid.
    Else the rewards the key names, paid, and beside them at weight 0 the task's own the key leaves
    out: logged on the same completions, paying nothing, so the doctor reads the task's answer reward
    beside the one the arm is paid (chapter 4's watched reward)."""
    from task.mistagged import answer_tag_reward

    own = list(task.reward_funcs)  # correctness_reward, format_reward
    if key == "task":
        return own, None
    known = {f.__name__: f for f in (*own, answer_tag_reward)}
    names = key.split("+")
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"unknown reward {', '.join(unknown)}: the arm's key names {', '.join(known)}")
    paid = [known[n] for n in names]
    watched = [f for f in own if f not in paid]
    return [*paid, *watched], [1.0] * len(paid) + [0.0] * len(watched)


def check_paid(task, funcs, weights) -> str:
    """Chapter 7's pre-flight (`task check`) of the rewards an arm is paid, as if they were its task's:
    the check a reader's own task file with these rewards meets before any run. The run's own check
    (tag `task_check`) scored the task's rewards; this one (tag `task_check_paid`) the arm's."""
    from task.check import check

    paid = tuple(f for f, w in zip(funcs, weights, strict=True) if w)
    report = check(dataclasses.replace(task, reward_funcs=paid), fast=True)
    print(report.verdict())
    return "passed" if report.ok else "failed: " + ",".join(f.check for f in report.failed)


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool], reward_weights=None):
    """Chapter 1's GRPOConfig, from the arm's settings (its break, or its break and the doctor's step),
    with the arm's reward weights (None: every reward paid)."""
    config = FIRST.grpo_config(s, output_dir, precision)
    config.reward_weights = reward_weights
    return config


def train(run: grpolab.Run, reward: str = "task") -> None:
    """One arm: chapter 1's trainer call, paid by the arm's rewards, with the arm's settings."""
    model, tokenizer = run.load_policy()  # Unsloth first: on a GPU it swaps in its own GRPOTrainer
    from trl import GRPOTrainer

    funcs, weights = rewards(run.task, reward)
    if weights is not None:  # paid other rewards than the task's: would its pre-flight have caught them?
        import mlflow

        mlflow.set_tag("task_check_paid", check_paid(run.task, funcs, weights))
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=funcs,
        args=grpo_config(run.settings, run.output_dir, run.precision(model), weights),
        train_dataset=run.train_dataset,
    )
    run.train(trainer)


def main(argv: list[str] | None = None) -> int:
    from grpolab.chapters import arms

    return arms.main(LAB_DIR, ARMS, train, argv, doc=__doc__)


if __name__ == "__main__":
    grpolab.exit_process(main())
