"""The tests of largest_digit.py: `uv run pytest labs/grpo-own-task/test_largest_digit.py`. Add your own beside them."""

from __future__ import annotations

from pathlib import Path

from task import get_task
from task.check import check

TASK = get_task(str(Path(__file__).with_name("largest_digit.py")))


def test_the_task_check_passes():
    report = check(TASK)
    assert report.ok, "\n".join(report.lines())


def test_the_reference_answer_earns_the_most_and_another_answer_less():
    row = TASK.build_dataset(1, seed=0)[0]
    right = [{"role": "assistant", "content": f"<ans>{TASK.reference_answer(row)}</ans>"}]
    wrong = [{"role": "assistant", "content": "<ans>0</ans>"}]
    columns = {name: [row[name], row[name]] for name in TASK.reward_columns}
    scores = [f([row["prompt"]] * 2, [right, wrong], **columns) for f in TASK.reward_funcs]
    paid = [sum(pair) for pair in zip(*scores, strict=True)]
    assert paid[0] == TASK.max_reward > paid[1]


def test_no_held_out_prompt_is_a_training_prompt():
    train = {row["prompt"][-1]["content"] for row in TASK.build_dataset(500, seed=0)}
    held_out = {row["prompt"][-1]["content"] for row in TASK.build_eval_dataset(50, seed=0)}
    assert not train & held_out
