"""Chapter 4: reward hacking, watched as it happens, caught by the doctor, stopped by the reward and the KL leash.

The policy is paid by its reward, not by the task. A checker a real user writes first,
`str(answer) in completion` (task/loose.py: `contains_answer_reward`), pays a right answer however
it is phrased, and also the prompt's number echoed back (827 contains its last digit 7), or several
guesses at once. GRPO's advantage, A_i = r_i - mean(r_1..r_G), cannot tell those apart from a right
answer: whatever the reward pays more often than the group's mean is pushed up, right or not.

This chapter trains the same policy, from the same start, on chapter 4's task (the last digit of a
number) in arms, each a run nested under one MLflow run:

    exact          the task's own rewards (one integer in one <ans> tag, equal to the target)
    loose          the loose checker, at the book's beta (0.02)
    loose-beta0    the loose checker with no leash: no KL term at all
    loose-beta0.2  the loose checker on a ten times tighter leash

Every arm also logs the task's exact reward on its own completions, at weight 0 (TRL's
reward_weights): watched, paying nothing. So a loose arm's curves show the reward it is paid climbing
while the exact reward on the same completions does not, and held-out accuracy (always scored by the
task's exact rewards) stays flat or falls; the exact arm's climb together. The run doctor names the
hack from what it sees (the paid reward against the exact one, step by step, and held-out accuracy),
with the step where they parted and one next step. The beta sweep shows the leash: KL to the reference
policy per step (beta x KL is the loss's pull back to the start), and how much of the hack each beta
lets through. loss_type matters too: under "dr_grpo" (the book's) the loss sums over tokens with a
constant denominator, so a longer completion that games the checker weighs more in the gradient than
a short right one; "grpo" averages per completion, and "dapo" per token of the batch.

What it simplifies: short arms (24 steps on the CPU, 50 on a GPU), one process for all arms (the
memory peak of an arm after the first includes what earlier ones left), and one loose checker among
the many a user could write. Without a GPU the arms train the tiny stand-in, warm-started so it knows
the task now and then (grpolab/tiny_model/); measured there (seed 0, the same on every x86-64
machine), the exact arm's held-out accuracy goes 73.4% -> 100.0% while the loose arm's paid reward
climbs 0.49 -> 0.96 and its held-out accuracy falls to 0.0%: it writes a run of digits. On a GPU,
Qwen3-4B with the book's recipe on countdown (it knows last digits already), where the loose checker
pays a completion that restates the target.

Usage:
    uv run python labs/grpo-reward-hacking/train.py                        # every arm: GPU if there is one, else CPU
    uv run python labs/grpo-reward-hacking/train.py --arms exact,loose     # two arms only
    uv run python labs/grpo-reward-hacking/train.py --loss-type grpo       # every arm under another loss
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db               # the chapter's run, its arms under it
"""

from __future__ import annotations

from pathlib import Path

import grpolab
from grpolab.chapters import load_chapter
from grpolab.chapters.arms import Arm
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent
FIRST = load_chapter("grpo-first")  # chapter 1's lesson: its GRPO config is every arm's

# --- The arms: the rewards each is paid, and what it changes from lab.toml ------------------------
ARMS = (
    Arm("exact", "exact"),
    Arm("loose", "loose"),
    Arm("loose-beta0", "loose", {"beta": 0.0}),
    Arm("loose-beta0.2", "loose", {"beta": 0.2}),
)


def rewards(task, reward: str) -> tuple[list, list[float]]:
    """The reward functions an arm's trainer gets and their weights. Every arm logs the task's exact
    rewards and the loose checker on the same completions; only the arm's own are paid (weight 1)."""
    from task.loose import contains_answer_reward

    exact = list(task.reward_funcs)  # correctness_reward, format_reward
    if reward == "exact":
        return [*exact, contains_answer_reward], [1.0] * len(exact) + [0.0]
    if reward == "loose":
        return [contains_answer_reward, *exact], [1.0] + [0.0] * len(exact)
    raise ValueError(f"unknown reward {reward!r}: exact or loose")


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool], reward_weights=None):
    """Chapter 1's GRPOConfig, with the arm's reward weights (None: every reward paid)."""
    config = FIRST.grpo_config(s, output_dir, precision)
    config.reward_weights = reward_weights
    return config


def train(run: grpolab.Run, reward: str = "exact") -> None:
    """One arm: chapter 1's trainer call, paid by the arm's rewards."""
    model, tokenizer = run.load_policy()  # Unsloth first: on a GPU it swaps in its own GRPOTrainer
    from trl import GRPOTrainer

    funcs, weights = rewards(run.task, reward)
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
